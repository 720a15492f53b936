import pytest
import torch

from warpdecode.bench.harness import run_bench
from warpdecode.bench.results import BenchConfig
from warpdecode.errors import CapabilityError, ConfigError
from warpdecode.models.device import synchronize, torch_device


def test_cpu_and_cuda_names_parse():
    assert torch_device("cpu") == torch.device("cpu")
    synchronize(torch.device("cpu"))  # no-op off CUDA


@pytest.mark.parametrize("name", ["tpu", "gpu", "cuda:x", ""])
def test_unknown_device_names_are_config_errors(name):
    with pytest.raises(ConfigError, match="--device must be cpu, cuda or cuda:N"):
        torch_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_cuda_without_cuda_says_so():
    with pytest.raises(CapabilityError, match="sees no CUDA device"):
        torch_device("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_index_beyond_the_machine():
    with pytest.raises(CapabilityError, match="CUDA device"):
        torch_device(f"cuda:{torch.cuda.device_count()}")


def test_bench_refuses_a_package_on_another_device(tmp_path):
    with pytest.raises(ConfigError, match="--device cuda benchmarks --model"):  # before any file is read
        run_bench(BenchConfig(package=str(tmp_path / "pkg"), device="cuda", peers="none"), methods="none", progress=False)


def test_bench_command_repeats_the_device():
    assert "--device cuda:1" in BenchConfig(device="cuda:1").command()
    assert "--device" not in BenchConfig().command()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
@pytest.mark.parametrize("command", ["generate", "bench"])
def test_cli_device_without_cuda_is_a_one_line_error(tiny_model_dir, capsys, command):
    from warpdecode.cli import main

    argv = [command, "--model", str(tiny_model_dir), "--device", "cuda"]
    argv += ["--prompt", "x"] if command == "generate" else ["--peers", "none", "--limit", "1", "--out", "unused"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "sees no CUDA device" in err and len(err.strip().splitlines()) == 1
