"""The runtime path (generate / bench / packages on ONNX Runtime) imports no training dependency."""

import subprocess
import sys

RUNTIME_MODULES = ["warpdecode.cli", "warpdecode.commands", "warpdecode.decoding.generate", "warpdecode.decoding.registry",
                   "warpdecode.bench.harness", "warpdecode.export.package", "warpdecode.runtime.package",
                   "warpdecode.runtime.onnxruntime", "warpdecode.runtime.cudagraphs", "warpdecode.runtime.onnx_drafters",
                   "warpdecode.export.regression"]
TRAINING_ONLY = ["lightning", "pytorch_lightning", "torchmetrics", "wandb", "transformers"]


def test_runtime_modules_do_not_import_training_packages():
    code = (f"import importlib, sys\nfor m in {RUNTIME_MODULES!r}: importlib.import_module(m)\n"
            "from warpdecode.decoding import registry\nregistry.names('drafter')\n"
            f"print(sorted(p for p in {TRAINING_ONLY!r} if p in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
