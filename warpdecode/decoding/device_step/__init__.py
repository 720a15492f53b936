"""The device-resident speculative step: draft → verify → accept → KV commit → drafter update →
advance, with every buffer on the target's device and no host read inside the step, so that one
CUDA graph can replay it. It runs eagerly on CPU (`loop.run_device`), where it is tested against
plain greedy decoding and the host engine.

tree.py (the static tree a method drafts into), state.py (the device buffers of one request and the
device drafter protocol), prompt_lookup.py and token_recycling.py (drafters made of tensor ops),
step.py (one step), loop.py (the host loop that runs steps and reads the output)."""
