"""The install's cache of Horovod's build probes (scripts/horovod_probe_cache.py, appended to
horovod/common/util.py by scripts/install.sh): a remembered answer is reused only while the
extension and the framework are the files it was asked of."""

import json

import horovod.common.util as util


def gloo(verbose=False):
    return util._check_extension_lambda("torch", lambda ext: ext.gloo_built(), "built with Gloo", verbose)


def test_install_added_the_cache_to_horovod():
    assert hasattr(util, "_hvdtrain_probe_uncached"), "scripts/install.sh did not patch horovod/common/util.py"


def test_an_answer_is_asked_once_then_reused_and_asked_again_when_the_files_change(tmp_path, monkeypatch):
    probes = tmp_path / "probes.json"
    monkeypatch.setattr(util, "_HVDTRAIN_PROBE_FILE", str(probes))
    asked = []
    real = util._hvdtrain_probe_uncached
    monkeypatch.setattr(util, "_hvdtrain_probe_uncached", lambda *a: asked.append(a[2]) or real(*a))
    assert gloo() is True and asked == ["built with Gloo"]  # asked the extension (a forked import)
    assert gloo() is True and len(asked) == 1  # remembered
    entry = json.loads(probes.read_text())["torch: built with Gloo"]
    assert entry["key"] == [list(k) for k in util._hvdtrain_probe_key("torch")]
    # a reinstalled extension or framework: the stored key no longer matches, so the stale answer is not used
    entry["key"][0][2] -= 1
    probes.write_text(json.dumps({"torch: built with Gloo": {**entry, "result": False}}))
    assert gloo() is True and len(asked) == 2
    assert gloo(verbose=True) is True and len(asked) == 3  # verbose checks always ask


def test_a_corrupt_cache_file_is_ignored(tmp_path, monkeypatch):
    probes = tmp_path / "probes.json"
    probes.write_text("{not json")
    monkeypatch.setattr(util, "_HVDTRAIN_PROBE_FILE", str(probes))
    assert gloo() is True
    assert json.loads(probes.read_text())["torch: built with Gloo"]["result"] is True
