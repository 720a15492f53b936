"""Model-regression records of a package: a faithful rerun passes, a changed output or τ is reported."""

import json

import pytest

from warpdecode.errors import ConfigError
from warpdecode.export import regression
from warpdecode.runtime.package import InferencePackage

pytestmark = pytest.mark.usefixtures("single_thread")

PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 8], [1, 2, 3]]


@pytest.fixture(scope="module")
def recorded(tiny_package):
    return regression.run(InferencePackage.load(tiny_package), PROMPTS, ["none", "prompt_lookup", "hydra"],
                          max_new_tokens=12)


def test_rerun_of_the_record_passes(tiny_package, recorded, tmp_path):
    recorded.save(tmp_path / "record.json")
    assert regression.check(InferencePackage.load(tiny_package), regression.Record.load(tmp_path / "record.json")) == []
    outputs = {m: [r["token_ids"] for r in runs] for m, runs in recorded.results.items()}
    assert [len(t) for t in outputs["none"]] == [12, 12]
    assert outputs["prompt_lookup"] == outputs["hydra"] == outputs["none"]  # lossless methods


def test_changed_output_and_lower_tau_are_reported(tiny_package, recorded, tmp_path):
    data = json.loads(json.dumps(recorded.__dict__))
    data["results"]["none"][1]["token_ids"][4] += 1
    data["results"]["prompt_lookup"][0]["tau"] *= 1.5
    failures = regression.check(InferencePackage.load(tiny_package), regression.Record(**data))
    assert failures[0] == "none, prompt 1: output differs from token 4 on"
    assert failures[1].startswith("prompt_lookup, prompt 0: tau") and len(failures) == 2


def test_record_of_another_model_fails_at_once(tiny_package, recorded):
    other = regression.Record(**(recorded.__dict__ | {"fingerprint": "0123456789abcdef"}))
    assert regression.check(InferencePackage.load(tiny_package), other) == [
        f"the package holds model {recorded.fingerprint}, the record was made for 0123456789abcdef"]


def test_bad_records_are_refused(tmp_path, tiny_package):
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    with pytest.raises(ConfigError, match="is not a warpdecode-regression record"):
        regression.Record.load(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="text prompts need a package with a tokenizer"):
        regression.run(InferencePackage.load(tiny_package), ["hello"], ["none"])


def test_methods_are_specs_checked_before_any_run(tiny_package, recorded):
    package = InferencePackage.load(tiny_package)
    result = regression.run(package, PROMPTS, ["prompt_lookup:num_tokens=3"], max_new_tokens=12)
    outputs = [r["token_ids"] for r in result.results["prompt_lookup:num_tokens=3"]]
    assert outputs == [r["token_ids"] for r in recorded.results["none"]]  # lossless
    with pytest.raises(ConfigError, match=r"has no option\(s\) \['bogus'\]"):
        regression.run(package, PROMPTS, ["none", "prompt_lookup:bogus=1"])
