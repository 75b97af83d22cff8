"""Does the fused model compute what the original does: onnxruntime sessions, feeds and `verify`
(`runtime`), the judge's comparisons (`compare`) and excuses (`judge`: when a difference is the
original's own rounding, with `rounding`, its rounding envelope), input draws (`feeds`), the
higher-precision reference (`precision`). fuse()'s safety net and the differential fuzzer
(`fusionlab.fuzz`, beside it) judge with the same functions."""
