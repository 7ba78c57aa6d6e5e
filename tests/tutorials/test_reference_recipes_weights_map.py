"""tensordict's own recipes for model weights and ``map`` (GETTING_STARTED.md, "TensorDict to
represent state-dicts", "for functional programming", "for parameter serialization" and
"Preprocessing with TensorDict.map"; docs/source/saving.rst), run with only the import changed:
each block is the reference's text with ``/path/to/...`` made a temporary directory, run in a
fresh interpreter as a script (the map recipe starts worker processes), for both packages.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGES = ["tensordict_rs", "tensordict"]

STATE_DICT = """
import torch, torch.nn
from {pkg} import TensorDict
module = torch.nn.Sequential(torch.nn.Linear(3, 4))
state_dict = TensorDict.from_module(module)
print(sorted(state_dict.keys(True, True)))
state_dict.data.zero_() # Zeros the parameters
state_dict.to_module(module, inplace=True) # Update the parameters
assert (module[0].weight == 0).all()
"""

FUNCTIONAL = """
import torch
from {pkg} import TensorDict
module = torch.nn.Sequential(torch.nn.Linear(3, 4))
td = TensorDict.from_module(module)
td_zero = td.detach().clone().zero_()
with td_zero.to_module(module):
    y = module(torch.randn(3))
assert (y == 0).all()
assert (module[0].weight != 0).any()

module = torch.nn.Sequential(torch.nn.Linear(3, 4))
td = TensorDict.from_module(module)
td_zero = td.detach().clone().zero_()
td_one = td.detach().clone() * 0 + 1
td_stack = torch.stack([td_zero, td_one])
def call_module(x, td):
    with td.to_module(module):
        return module(x)
x = torch.ones(2, 10, 3)
y = torch.vmap(call_module)(x, td_stack)
assert (y[0] == 0).all()
assert (y[1] == 4).all()
print("ok")
"""

SERIALIZATION = """
import torch
from torch import nn
from {pkg} import TensorDict
model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 3))
params = TensorDict.from_module(model)
params.memmap("{tmp}/saved/folder/", num_threads=16)  # adjust num_threads for speed
# load params
params = TensorDict.load_memmap("{tmp}/saved/folder/", num_threads=16)
params.to_module(model)  # load onto model
params["0"].to_module(model[0])  # load on a slice of the model
# in the latter case we could also have loaded only the slice we needed
params0 = TensorDict.load_memmap("{tmp}/saved/folder/0", num_threads=16)
params0.to_module(model[0])  # load on a slice of the model
assert torch.equal(model[0].weight, params0["weight"])
print("ok")
"""

SAVING_RST = """
import torch
from torch import nn
from {pkg} import TensorDict
model = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1,
                       dim_feedforward=32)
weights = TensorDict.from_module(model)
weights_disk = weights.memmap("{tmp}/saved/dir", num_threads=32)
new_weights = TensorDict.load_memmap("{tmp}/saved/dir")
assert (weights_disk == new_weights).all()
print("ok")
"""

MAP = """
import torch
from {pkg} import TensorDict, MemoryMappedTensor
import tempfile

def process_data(data):
    images = data.get("images").flip(-2).clone()
    labels = data.get("labels") // 10
    # we update the td inplace
    data.set_("images", images)  # flip image
    data.set_("labels", labels)  # cluster labels

if __name__ == "__main__":
    # create data_preproc here
    data = TensorDict({{
        "images": torch.arange(8 * 3 * 4 * 4, dtype=torch.uint8).view(8, 3, 4, 4),
        "labels": torch.arange(8, dtype=torch.int) * 10}}, batch_size=[8])
    data = data.memmap_like("{tmp}/dataset")
    data["images"].copy_(torch.arange(8 * 3 * 4 * 4, dtype=torch.uint8).view(8, 3, 4, 4))
    data["labels"].copy_(torch.arange(8, dtype=torch.int) * 10)
    # process 1 images at a time
    data_preproc = data.map(process_data, num_workers=4, chunksize=0, pbar=True)
    assert data_preproc is None
    expected = torch.arange(8 * 3 * 4 * 4, dtype=torch.uint8).view(8, 3, 4, 4).flip(-2)
    assert torch.equal(data["images"].as_subclass(torch.Tensor), expected)
    assert data["labels"].tolist() == list(range(8))
    print("ok")
"""


def run_script(code: str, tmp: Path) -> str:
    script = tmp / "recipe.py"
    script.write_text(textwrap.dedent(code))
    result = subprocess.run(
        [sys.executable, "-W", "ignore::FutureWarning", str(script)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


@pytest.mark.parametrize("pkg", PACKAGES)
@pytest.mark.parametrize(
    "recipe", [STATE_DICT, FUNCTIONAL, SERIALIZATION, SAVING_RST, MAP],
    ids=["state_dict", "functional", "serialization", "saving_rst", "map"],
)  # fmt: skip
def test_recipe(tmp_path: Path, pkg: str, recipe: str) -> None:
    outputs = run_script(recipe.format(pkg=pkg, tmp=tmp_path), tmp_path)
    assert outputs.strip().splitlines()[-1] in ("ok",) or recipe is STATE_DICT


def test_state_dict_recipe_prints_the_same(tmp_path: Path) -> None:
    printed = [run_script(STATE_DICT.format(pkg=pkg, tmp=tmp_path), tmp_path) for pkg in PACKAGES]
    assert printed[0] == printed[1]
