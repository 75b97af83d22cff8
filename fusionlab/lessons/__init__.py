"""Simulators and generators that exist to teach one lesson each, kept apart from the fusion engine.

`codegen` (notebook 06), `reductions` (notebook 07), `double_buffer` (notebook 11), `dynamic_shapes`
(notebook 12), `decoding` (notebook 13).
"""
