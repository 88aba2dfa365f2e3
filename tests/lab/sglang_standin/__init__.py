"""The SGLang stand-in: its source (src/, the `sglang` distribution built into wheels), the wheel builder and the
test harness."""
