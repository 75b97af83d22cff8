"""Simulators and generators that exist to teach one lesson each, kept apart from the fusion engine.

`codegen` (notebook 01), `overfusion` (notebook 08), `reductions` (notebooks 09 and 10), `decoding` (notebooks 11
and 12), `quantization` (notebooks 13 and 14), `double_buffer` (notebook 19), `dynamic_shapes` (notebooks 20 and 21).
"""
