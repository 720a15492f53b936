"""Everything behind the Backbone protocol and the package on disk, below `decoding/` (it imports only from
`models/` and the base modules):

    load.py           (model | package) x backends -> Backbones: the one loader of generate and bench
    cudagraphs.py     the PyTorch model's decode and verify steps replayed as CUDA graphs
    onnxruntime.py    an exported step graph on ONNX Runtime
    package.py        the inference package reader (verification, backend names) and manifest.py, its schema
    onnx_weights.py   reading an exported graph's weights and the external data files it names
    onnx_drafters.py  the learned drafters' ONNX graphs on ONNX Runtime
"""
