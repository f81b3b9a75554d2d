from pathlib import Path

import pytest
import yaml

from workbook_lib.running import params as P
from workbook_lib.running.environment import resolve_device
from workbook_lib.exceptions import ParamsError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["default", "ci", "full"])
def test_shipped_params_files_validate(name):
    p = P.load_params_file(ROOT / "params" / f"{name}.yaml")
    assert set(p) == set(P.FIELDS)
    assert p["snapshot"] == "string12"


def test_name_lookup_in_params_dir():
    assert P.load_params_file("ci")["scale"] == 0.005


def test_empty_means_defaults():
    assert P.validate({}) == P.defaults()


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ParamsError) as e:
        P.validate({"batchsize": 3})
    msg = str(e.value)
    assert "batchsize" in msg and "batch_sizes" in msg and "scale" in msg


@pytest.mark.parametrize("key,value,words", [
    ("scale", -1.0, ["'scale'", "positive", "-1.0"]),
    ("scale", "big", ["'scale'", "number", "'big'"]),
    ("seed", 1.5, ["'seed'", "integer"]),
    ("batch_sizes", [], ["'batch_sizes'", "non-empty"]),
    ("batch_sizes", [4, 0], ["'batch_sizes'", "positive"]),
    ("batch_sizes", 4, ["'batch_sizes'", "list"]),
    ("device", "tpu", ["'device'", "tpu"]),
    ("perturbation_k", 7000, ["'perturbation_k'", "6607", "7000"]),
    ("perturbation_k", -1, ["'perturbation_k'", ">= 0"]),
    ("perturbation_k", {2: 0.5, 3: 0.4}, ["'perturbation_k'", "sum to 1"]),
    ("perturbation_k", "three", ["'perturbation_k'"]),
    ("snapshot", "nope", ["'snapshot'", "nope"]),
    ("snapshot", "/tmp/does/not/exist.pt", ["'snapshot'", "does not exist"]),
    ("strategies", ["fast"], ["'strategies'", "fast"]),
    ("dual_forward", "yes", ["'dual_forward'", "true or false"]),
    ("sweep_p", [0.5, 1.0], ["'sweep_p'"]),
])
def test_bad_values_name_key_and_value(key, value, words):
    with pytest.raises(ParamsError) as e:
        P.validate({key: value})
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_k_mapping_normalised():
    p = P.validate({"perturbation_k": {"2": 0.25, 3: 0.75}})
    assert p["perturbation_k"] == {2: 0.25, 3: 0.75}
    assert P.max_k(p["perturbation_k"]) == 3
    assert P.mean_k(p["perturbation_k"]) == pytest.approx(2.75)


def test_bad_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"scale": 0.1, "colour": "red"}))
    with pytest.raises(ParamsError, match="colour"):
        P.load_params_file(f)
    with pytest.raises(ParamsError, match="does not exist"):
        P.load_params_file(tmp_path / "missing.yaml")
    f.write_text("scale: [1, 2\n")
    with pytest.raises(ParamsError, match="YAML"):
        P.load_params_file(f)


def test_notebook_params_same_validation():
    base = P.notebook_params(str(ROOT / "params" / "ci.yaml"), {"seed": 3})
    assert base["seed"] == 3 and base["scale"] == 0.005
    with pytest.raises(ParamsError, match="unknown"):
        P.notebook_params(None, {"sead": 3})
    with pytest.raises(ParamsError, match="'layers'"):
        P.notebook_params(None, {"layers": 0})


def test_check_against_graph():
    p = P.validate({"perturbation_k": 5})
    with pytest.raises(ParamsError, match="gene count"):
        P.check_against_graph(p, 4)
    P.check_against_graph(p, 5)


def test_cuda_without_gpu_is_an_error():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ParamsError, match="cuda"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"
