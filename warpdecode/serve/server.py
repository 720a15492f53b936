"""Run the app under uvicorn: listens until SIGINT/SIGTERM, then stops accepting connections, lets
the requests in flight finish (their streams included), and ends the scheduler (`create_app`'s lifespan)."""

from __future__ import annotations

import uvicorn

from warpdecode.decoding.specs import parse_method
from warpdecode.errors import ConfigError, WarpdecodeError, one_line
from warpdecode.models.backbone import Backbone
from warpdecode.models.tokenizer import Tokenizer
from warpdecode.serve.app import create_app
from warpdecode.serve.metrics import ServerMetrics
from warpdecode.serve.protocol import ApiError
from warpdecode.serve.scheduler import Scheduler


def build_server(target: Backbone, tokenizer: Tokenizer | None, *, model_name: str, method: str = "none",
                 drafter_options: dict[str, dict] | None = None, host: str = "127.0.0.1", port: int = 8000,
                 max_queue: int = 64, max_num_seqs: int = 16, max_model_len: int | None = None,
                 chunked_prefill_size: int | None = None, log_level: str = "info") -> uvicorn.Server:
    """A uvicorn server for `target` (not started: `.run()` blocks until a signal ends it)."""
    if not target.config.causal:
        raise ConfigError("serve runs causal language models; a diffusion LM decodes with `warpdecode generate`")
    if tokenizer is None:
        raise ConfigError("serve needs a tokenizer: this model or package has none")
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port must be in [0, 65535], got {port}")
    if max_queue < 1:
        raise ConfigError(f"--max-queue must be >= 1, got {max_queue}")
    if max_num_seqs < 1:
        raise ConfigError(f"--max-num-seqs must be >= 1, got {max_num_seqs}")
    if max_model_len is not None and not 2 <= max_model_len <= target.config.max_seq_len:
        raise ConfigError(f"--max-model-len must be in [2, {target.config.max_seq_len}] (the model's context), "
                          f"got {max_model_len}")
    if chunked_prefill_size is not None and chunked_prefill_size < 1:
        raise ConfigError(f"--chunked-prefill-size must be >= 1, got {chunked_prefill_size}")
    scheduler = Scheduler(target, tokenizer, metrics=ServerMetrics(), max_queue=max_queue,
                          drafter_options=drafter_options, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                          chunked_prefill_size=chunked_prefill_size)
    try:
        app = create_app(scheduler, model_name=model_name, default_method=method)
        scheduler.method(parse_method(method).with_defaults(scheduler.drafter_options), do_sample=False)
    except ApiError as error:  # a bad --method, reported as the command-line error it is
        raise ConfigError(f"--method {method!r}: {error.message}") from None
    except WarpdecodeError as error:
        raise ConfigError(f"--method {method!r}: {one_line(error)}") from None
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=None)
    return uvicorn.Server(config)
