"""Export: ONNX step graphs, the inference package, and the ONNX Runtime backend."""
