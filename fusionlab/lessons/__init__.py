"""Simulators and generators that exist to teach one lesson each, kept apart from the fusion engine.

`codegen` (notebook 01), `overfusion` (notebook 08), `reductions` (notebook 09), `decoding` (notebook 11), `quantization` (notebook 13),
`double_buffer` (notebook 19), `dynamic_shapes` (notebook 20).
"""
