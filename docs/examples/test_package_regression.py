"""A model-regression test for a deployment's CI: copy this file into your tests and set the two paths.

Record once, from the package you approved (commit the JSON next to this test):

    warpdecode regress packages/smollm2 --record tests/regression/smollm2.json --methods none,hydra

Then every CI run reruns the recorded prompts and methods and fails on any changed output or on a tau
more than 5 % below the recorded one (a drafter that stopped being accepted).
"""

from pathlib import Path

import pytest

PACKAGE = Path("packages/smollm2")
RECORD = Path("tests/regression/smollm2.json")


@pytest.mark.skipif(not PACKAGE.is_dir(), reason=f"{PACKAGE} not built here")
def test_package_matches_its_record():
    from warpdecode.export import regression
    from warpdecode.export.package import InferencePackage

    failures = regression.check(InferencePackage.load(PACKAGE), regression.Record.load(RECORD), tau_tolerance=0.05)
    assert not failures, "\n".join(failures)
