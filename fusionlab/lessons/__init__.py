"""Simulators and generators that exist to teach one lesson each, kept apart from the fusion engine.

`codegen` (notebook 01), `reductions` (notebook 08), `decoding` (notebook 09), `quantization` (notebook 10),
`double_buffer` (notebook 14), `dynamic_shapes` (notebook 15).
"""
