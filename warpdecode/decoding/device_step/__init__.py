"""The device-resident speculative step: draft → verify → accept → KV commit → drafter update →
advance, with every buffer on the target's device and no host read inside the step, so that one
CUDA graph can replay it. It runs eagerly on CPU (`loop.run_device`), where it is tested against
plain greedy decoding and the host engine.

tree.py (the static tree a method drafts into, and the auxiliary rows a drafter may add to the verify
forward), state.py (the device buffers of one request and the device drafter protocol),
prompt_lookup.py, token_recycling.py, oracle.py and the packaged learned drafters' forms (learned.py,
heads.py, medusa.py, hydra.py, eagle.py, ppd.py): drafters made of tensor ops; step.py (one step),
loop.py (the host loop that runs steps and reads the output), graphs.py (the captured step)."""
