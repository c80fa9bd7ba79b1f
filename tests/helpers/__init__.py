"""Code the tests share, imported by name (`from helpers.models import tiny_config`): tests/ is on sys.path
(pyproject.toml, [tool.pytest.ini_options] pythonpath), so every test folder reaches it. Test modules import
from here, never from one another; fixtures live in the conftest.py of the folder that uses them."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout
FIXTURES = ROOT / "tests" / "fixtures"  # committed files the tests read (see their READMEs)
