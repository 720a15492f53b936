"""Grammar-constrained decoding: a per-sequence `Constraint` (the allowed next tokens of a JSON Schema,
regex, Lark grammar or choice list, built by `formats.compile_response_format` on llguidance) and
`ConstrainedDecoding`, the engine's hook that masks every verified row with its own path's state,
cuts draft tokens the grammar forbids and drafts the tokens it forces (docs/structured-output.md).
"""
