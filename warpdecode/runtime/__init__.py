"""Everything behind the Backbone protocol and the package on disk: the backends the decoding runtime runs
on (`cudagraphs`: the PyTorch model's steps replayed as CUDA graphs; `onnxruntime`: an exported step graph
on ONNX Runtime). Imports only from `models/` and below."""
