"""Machine info and the per-generation peak-RSS probe."""

import os

import pytest
import torch

from warpdecode.bench.machine import PeakRSS, machine_info


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux /proc/self/clear_refs")
def test_peak_rss_measures_each_block_from_its_own_baseline():
    with PeakRSS() as big:
        block = bytearray(64 * 2**20)  # zero-filled: every page is touched
        del block
    with PeakRSS() as small:
        pass
    assert big.mib is not None and 60 <= big.mib <= 80
    assert small.mib is not None and small.mib < 8  # the high-water mark was reset


def test_machine_info_records_threads_and_versions():
    info = machine_info()
    assert info["torch"] == torch.__version__ and info["torch_threads"] == torch.get_num_threads()
    assert info["cpu_count"] == os.cpu_count() and info["cpu"]
    assert info["date"].endswith("+00:00") and len(info["load_average"]) == 3
