"""tformer's benchmarks: the tracked suite (`python -m benchmarks run NAME`), the records it writes
(benchmarks/records/) and the results pages rendered from them (`python -m benchmarks render`). Each script in
this folder still runs on its own (`python benchmarks/NAME.py`); the dated one-off studies are in studies/."""
