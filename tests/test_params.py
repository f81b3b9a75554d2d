from pathlib import Path

import pytest
import yaml

from workbook_lib.configs.cells import parameters_cell
from workbook_lib.configs.schema import FIELDS, defaults
from workbook_lib.configs.validation import (Params, check_against_graph, load_params_file, max_k,
                                             mean_k, results_relevant, validate)
from workbook_lib.common.device import resolve_device
from workbook_lib.exceptions import ParamsError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", ["default", "ci", "full"])
def test_shipped_params_files_validate(name):
    p = load_params_file(ROOT / "params" / f"{name}.yaml")
    assert set(p) == set(FIELDS)
    assert p["snapshot"] == "string12"


def test_name_lookup_in_params_dir():
    assert load_params_file("ci")["scale"] == 0.005


def test_empty_means_defaults():
    assert validate({}) == defaults()


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(ParamsError) as e:
        validate({"batchsize": 3})
    assert "did you mean 'batch_sizes'" in str(e.value) and e.value.key == "batchsize"
    with pytest.raises(ParamsError, match="did you mean 'hidden'"):
        validate({"hiden": 3})


def test_command_line_strings_are_read_as_yaml():
    """papermill -p passes lists as strings; YAML reads 1e-3 as a string."""
    p = validate({"scale": "1e-3", "batch_sizes": "[1, 2]", "perturbation_k": "{2: 0.5, "
                    "3: 0.5}", "memory_budget_gb": "null", "rdzv_endpoint": "null"})
    assert p["scale"] == 0.001 and p["batch_sizes"] == [1, 2]
    assert p["perturbation_k"] == {2: 0.5, 3: 0.5} and p["memory_budget_gb"] is None
    assert p["rdzv_endpoint"] is None


def test_default_file_is_the_schema_default():
    assert load_params_file(ROOT / "params" / "default.yaml") == defaults()


def test_placement_keys_are_not_results_relevant():
    p = validate({"nnodes": 2, "rdzv_endpoint": "n1:29500"})
    rel = results_relevant(p)
    assert "nnodes" not in rel and "rdzv_endpoint" not in rel and "scale" in rel


def test_parameters_cell_is_read_by_papermill():
    from papermill.translators import PythonTranslator

    found = {p.name: p for p in PythonTranslator.inspect({"source": parameters_cell()})}
    assert set(FIELDS) | {"run_dir"} == set(found)
    assert found["memory_budget_gb"].inferred_type_name == "Optional[float]"
    assert found["scale"].default == "0.1" and "edge-count" in found["scale"].help
    ns = {}
    exec(parameters_cell(), ns)  # the cell runs as Python and gives the defaults
    assert {k: ns[k] for k in FIELDS} == defaults()


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
    ("dual_forward", "maybe", ["'dual_forward'", "true or false"]),
    ("sweep_p", [0.5, 1.0], ["'sweep_p'"]),
    ("exactness_genes", 1, ["'exactness_genes'", ">= 2"]),
    ("exactness_genes", 3, ["'exactness_genes'", "exceed"]),
    ("profile_wait", 0, ["'profile_wait'", ">= 1"]),
    ("world_sizes", [1, 3, 4], ["'world_sizes'", "divide"]),
    ("loop_max_steps", 2, ["'loop_max_steps'", "loop_steps"]),
    ("gap_strategies", ["dango_wildtype", "dango_wildtype"], ["'gap_strategies'"]),
])
def test_bad_values_name_key_and_value(key, value, words):
    with pytest.raises(ParamsError) as e:
        validate({key: value})
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_k_mapping_normalised():
    p = validate({"perturbation_k": {"2": 0.25, 3: 0.75}})
    assert p["perturbation_k"] == {2: 0.25, 3: 0.75}
    assert max_k(p["perturbation_k"]) == 3
    assert mean_k(p["perturbation_k"]) == pytest.approx(2.75)


def test_bad_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump({"scale": 0.1, "colour": "red"}))
    with pytest.raises(ParamsError, match="colour"):
        load_params_file(f)
    with pytest.raises(ParamsError, match="does not exist"):
        load_params_file(tmp_path / "missing.yaml")
    f.write_text("scale: [1, 2\n")
    with pytest.raises(ParamsError, match="YAML"):
        load_params_file(f)


def test_notebook_namespace_same_validation():
    from workbook_lib.running.notebook import notebook_params

    ns = {**defaults(), "seed": 3, "run_dir": "runs/x", "np": __import__("numpy")}
    p, run_dir = notebook_params(ns)
    assert p["seed"] == 3 and run_dir == ROOT / "runs" / "x"
    with pytest.raises(ParamsError, match="did you mean 'seed'"):
        notebook_params({**ns, "sead": 3})
    with pytest.raises(ParamsError, match="-p KEY VALUE"):
        notebook_params({**ns, "params": {"scale": 0.1}})
    with pytest.raises(ParamsError, match="'layers'"):
        notebook_params({**ns, "layers": 0})
    # found by a user trial: papermill -p strategies '[]' -p pipelines [two] was refused, the
    # cell's default gap naming built-in strategies the run does not compare; now the first two
    # pipelines, as on the command line; a default gap the run compares stays; a wrong one given
    # beside pipelines is still refused
    two = ["examples/lazy_pyg.py:make_pipeline", "examples/nodemask_pyg.py:make_pipeline"]
    p, _ = notebook_params({**ns, "strategies": [], "pipelines": two})
    assert list(p.gap_strategies) == ["lazy_pyg", "nodemask_pyg"]
    # as papermill's -p passes them: the lists' text (a second trial)
    p, _ = notebook_params({**ns, "strategies": "[]", "pipelines": str(two)})
    assert list(p.gap_strategies) == ["lazy_pyg", "nodemask_pyg"]
    p, _ = notebook_params({**ns, "pipelines": two})
    assert list(p.gap_strategies) == list(defaults()["gap_strategies"])
    with pytest.raises(ParamsError, match="'gap_strategies' names"):
        notebook_params({**ns, "strategies": [], "pipelines": two,
                         "gap_strategies": ["lazy_pyg", "dango_wildtype"]})


def test_check_against_graph():
    p = validate({"perturbation_k": 5, "exactness_genes": 6})
    with pytest.raises(ParamsError, match="'perturbation_k'.*gene count"):
        check_against_graph(p, 4)
    with pytest.raises(ParamsError, match="'exactness_genes'"):
        check_against_graph(p, 5)
    check_against_graph(p, 6)


def test_cuda_without_gpu_is_an_error():
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ParamsError, match="cuda"):
        resolve_device("cuda")
    assert resolve_device("auto").type == "cpu"


# --- the validated params object: frozen, typed, and the mapping every caller reads ---------

def _old_dict(name: str) -> dict:
    """What ``validate`` returned before it returned a :class:`Params`: the schema defaults
    updated with the file's values (the shipped files give every value in its field's type)."""
    return {**defaults(), **(yaml.safe_load((ROOT / "params" / f"{name}.yaml").read_text())
                               or {})}


@pytest.mark.parametrize("name", ["default", "ci", "full"])
def test_params_equal_the_old_dict(name):
    p = load_params_file(ROOT / "params" / f"{name}.yaml")
    old = _old_dict(name)
    assert isinstance(p, Params)
    assert p == old and old == p and dict(p) == old and {**p} == old
    assert list(p) == list(FIELDS) and len(p) == len(FIELDS)
    assert all(type(p[k]) is type(v) or isinstance(v, int) for k, v in old.items()), \
        {k: (type(p[k]), type(v)) for k, v in old.items() if type(p[k]) is not type(v)}
    assert p != {**old, "seed": old["seed"] + 1}


def test_params_read_as_a_mapping_and_by_attribute():
    from collections.abc import Mapping

    p = validate({"loop_steps": 7, "loop_max_steps": 9})
    assert isinstance(p, Mapping)
    assert p["loop_steps"] == p.loop_steps == p.get("loop_steps") == 7
    assert p.get("no_such_key") is None and p.get("no_such_key", 3) == 3
    assert "loop_steps" in p and "no_such_key" not in p
    with pytest.raises(KeyError):
        p["no_such_key"]
    assert dict(p.items())["loop_max_steps"] == 9 and set(p.keys()) == set(FIELDS)
    assert {**p, "seed": 5}["seed"] == 5 and p.seed == 0  # a changed copy is a plain dict
    assert validate({**p, "seed": 5}).seed == 5  # ... validated again into Params


def test_replace_is_a_validated_copy():
    p = validate({})
    q = p.replace(seed=5, batch_sizes=(1, 2))
    assert isinstance(q, Params) and q.seed == 5 and q.batch_sizes == [1, 2] and p.seed == 0
    with pytest.raises(ParamsError, match="'seed' must be an integer"):
        p.replace(seed=1.5)
    with pytest.raises(ParamsError, match="did you mean 'seed'"):
        p.replace(sead=1)
    with pytest.raises(ParamsError, match="'loop_max_steps' must be >= loop_steps"):
        p.replace(loop_steps=50)  # checked across keys too


def test_params_are_frozen():
    import dataclasses

    p = validate({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.loop_steps = 3
    with pytest.raises(TypeError, match="read-only"):
        p["loop_steps"] = 3
    with pytest.raises(TypeError, match="read-only"):
        del p["loop_steps"]
    for method in ("update", "setdefault", "pop", "popitem", "clear"):
        assert not hasattr(p, method), method
    with pytest.raises(TypeError):
        hash(p)  # like the dict it replaces (its lists are not hashable either)
    assert p.loop_steps == defaults()["loop_steps"]


def test_params_pickle_and_copy_round_trip():
    import copy
    import pickle

    p = load_params_file(ROOT / "params" / "ci.yaml")
    for back in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), copy.copy(p)):
        assert isinstance(back, Params) and back == p and back.perturbation_k == {2: 0.25,
                                                                                      3: 0.75}


def test_params_to_json_and_papermill():
    import json

    from papermill.translators import PythonTranslator

    from workbook_lib.records import to_json

    p = load_params_file(ROOT / "params" / "ci.yaml")
    doc = json.loads(json.dumps(to_json(p)))
    assert doc["perturbation_k"] == {"2": 0.25, "3": 0.75} and doc["batch_sizes"] == [1, 4, 28]
    assert validate(doc) == p  # a results file's _meta.params reads back as the same params
    src = PythonTranslator.codify({**to_json(p), "run_dir": "runs/x"})
    ns = {}
    exec(src, ns)
    assert validate({k: ns[k] for k in FIELDS}) == p


def test_params_fields_are_typed():
    import typing

    hints = typing.get_type_hints(Params)
    assert list(hints) == list(FIELDS)
    assert hints["loop_steps"] is int and hints["batch_sizes"] == list[int]
    assert hints["memory_budget_gb"] == float | None
    assert FIELDS["perturbation_k"].type_hint == "Union[int, Dict[int, float]]"
    assert FIELDS["rdzv_endpoint"].type_name == "a string or null"
    assert Params() == defaults()


def test_the_sections_hold_every_key_once_with_its_type_and_read_the_params():
    import dataclasses

    from workbook_lib.configs.schema import FIELDS, SECTIONS

    seen = [(f.name, f.type) for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
    assert sorted(n for n, _ in seen) == sorted(FIELDS)
    assert all(FIELDS[n].type == t for n, t in seen)
    p = validate({"batch_size_lazy": 5, "adopt_lr": 0.2})
    assert p.loop.batch_size_lazy == 5 and p.adopt.adopt_lr == 0.2 and p.data.seed == p.seed
    assert p.replace(seed=4).data.seed == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.loop.batch_size_lazy = 3
    # a section is no key: the params still iterate, validate and pickle as their keys
    assert "loop" not in p and list(p) == list(FIELDS)


def test_a_range_check_names_each_way_out_and_nan_as_such():
    """A ranged value below, inside and above its range, and NaN (which the file loader refuses
    earlier as not finite; the check itself says what NaN is, not that it is too large)."""
    from workbook_lib.configs.checks import between, positive_at_most

    check = between(5, 100, "too short", "too long")
    assert check(4) == "must be at least 5 (too short)"
    assert check(5) is None and check(100) is None
    assert check(101) == "must be at most 100 (too long)"
    assert check(float("nan")) == "must be a number from 5 to 100 (got NaN)"
    assert between(0.5, 1e6, "a", "b")(float("nan")) == \
        "must be a number from 0.5 to 1,000,000 (got NaN)"
    capped = positive_at_most(10, "why")
    assert capped(0) == "must be positive" and capped(10) is None
    assert capped(11) == "must be at most 10 (why)"
    assert capped(float("nan")) == "must be a positive number (got NaN)"
