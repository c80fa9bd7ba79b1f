"""Configuration: unknown keys, wrong types and impossible shapes fail early, naming the key."""

import pytest

from tformer.config import (Config, ConfigError, check_inference_overrides, from_dict, load_config,
                            merge_overrides, to_dict)


def test_defaults_round_trip_through_a_dict():
    cfg = Config()
    assert from_dict(to_dict(cfg)) == cfg
    assert cfg.train.betas == (0.9, 0.98) and cfg.train.adam_eps == 1e-9


def test_overrides_are_typed_by_yaml():
    cfg = from_dict(merge_overrides({}, ["model.d_model=64", "train.betas=[0.8, 0.9]", "model.norm=pre",
                                         "train.lr=2"]))
    assert cfg.model.d_model == 64 and cfg.train.betas == (0.8, 0.9) and cfg.model.norm == "pre"
    assert cfg.train.lr == 2.0 and isinstance(cfg.train.lr, float)


@pytest.mark.parametrize("override,message", [
    ("model.d_modle=64", r"'model.d_modle' is unknown; did you mean 'model.d_model'"),
    ("modle.d_model=64", r"'modle' is unknown; did you mean 'model'"),
    ("model.d_model=abc", r"'model.d_model': must be an integer"),
    ("model.d_model=64.5", r"'model.d_model': must be an integer"),
    ("model.norm=middle", r"'model.norm': must be one of 'post', 'pre'"),
    ("model.tie_generator=1", r"'model.tie_generator': must be true or false"),
    ("model.n_heads=5", r"'model.d_model': 256 is not divisible by model.n_heads=5"),
    ("model.dropout=1.5", r"'model.dropout': must be in \[0, 1\)"),
    ("data.min_len=40", r"'data.min_len': need 1 <= min_len <= max_len"),
    ("train.betas=[0.9]", r"'train.betas': must be a list of 2 values"),
    ("decode.max_len_a=0", r"max_len_a and max_len_b are both 0"),
])
def test_bad_settings_name_the_key(override, message):
    extra = ["decode.max_len_b=0"] if override.startswith("decode.max_len_a") else []
    with pytest.raises(ConfigError, match=message):
        from_dict(merge_overrides({}, [override, *extra]))


def test_errors_say_whether_the_file_or_the_command_line_is_wrong(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("model:\n  d_model: 64\n  heads: 4\n")
    with pytest.raises(ConfigError, match=r"'model.heads' is unknown.*\(in .*c.yaml\)"):
        load_config(f)
    f.write_text("model:\n  d_model: 64\n")
    with pytest.raises(ConfigError, match=r"'train.max_step' is unknown.*command-line"):
        load_config(f, ["train.max_step=3"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    f.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(f)


def test_only_inference_settings_change_after_training():
    check_inference_overrides(["decode.max_len_b=3", "model.attention=dense"])
    with pytest.raises(ConfigError, match="'model.d_model' cannot change after training"):
        check_inference_overrides(["model.d_model=8"])
    with pytest.raises(ConfigError, match="not of the form"):
        check_inference_overrides(["decode"])


def test_exponent_notation_without_a_dot_is_a_number(tmp_path):
    """YAML 1.1 (PyYAML) reads `1e-4` as a string; for float keys it is the number users mean."""
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 5e-4\n  adam_eps: 1E-9\n")
    cfg = load_config(path, ["decode.len_penalty=+6e-1"])
    assert (cfg.train.lr, cfg.train.adam_eps, cfg.decode.len_penalty) == (5e-4, 1e-9, 0.6)
    with pytest.raises(ConfigError, match="'train.lr': must be a number, got '5e-4x'"):
        load_config(path, ["train.lr=5e-4x"])
