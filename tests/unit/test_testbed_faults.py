"""`provision testbed fault HOST FAULT...` arguments -> hardware spec faults (validated by hwspec.resolve)."""

from __future__ import annotations

import pytest

from provisioner.errors import UsageError
from provisioner_testbed import hwspec
from provisioner_testbed.rack import merge_faults, parse_fault


@pytest.mark.parametrize(
    ("arg", "want"),
    [
        ("hca_down=mlx5_3", {"hca_down": ["mlx5_3"]}),
        ("hca_down=mlx5_3,mlx5_4", {"hca_down": ["mlx5_3", "mlx5_4"]}),
        ("hca_rate=mlx5_2:200", {"hca_rate": {"mlx5_2": 200}}),
        ("xid=79", {"xid": [{"gpu": 0, "code": 79}]}),
        ("xid=3:79", {"xid": [{"gpu": 3, "code": 79}]}),
        ("ecc_uncorrectable=2", {"ecc_uncorrectable": [{"gpu": 2, "count": 1}]}),
        ("ecc_uncorrectable=2:5", {"ecc_uncorrectable": [{"gpu": 2, "count": 5}]}),
        ("missing_gpu", {"missing_gpu": 1}),
        ("missing_gpu=2", {"missing_gpu": 2}),
        ("nvlink_down", {"nvlink_down": True}),
        ("nvlink_down=1,2", {"nvlink_down": [1, 2]}),
        ("row_remap_pending=4", {"row_remap_pending": [4]}),
        ("fm_mismatch", {"fm_mismatch": True}),
        ("fm_mismatch=580.82.07", {"fm_mismatch": "580.82.07"}),
        ("persistence_off", {"persistence_off": True}),
        ("persistence-off", {"persistence_off": True}),
        ("acs_on", {"acs_on": True}),
        ("acs_on=0,7", {"acs_on": [0, 7]}),
        ("acs_on=0000:17:00.0", {"acs_on": ["0000:17:00.0"]}),
        ("vbios=96.00.61.00.01", {"vbios": "96.00.61.00.01"}),
        ("vbios=3:96.00.61.00.01", {"vbios": {"3": "96.00.61.00.01"}}),
        ("hca_fw=28.39.1002", {"hca_fw": "28.39.1002"}),
        ("hca_fw=mlx5_2:28.39.1002", {"hca_fw": {"mlx5_2": "28.39.1002"}}),
    ],
)
def test_each_fault_argument_resolves(arg: str, want: dict) -> None:
    got = parse_fault(arg)
    assert got == want
    hwspec.resolve({"node": "node01", "faults": got})  # the simulator accepts it


@pytest.mark.parametrize("arg", ["melted", "hca_down", "hca_rate=mlx5_2", "xid=a:79", "xid=", "missing_gpu=x",
                                 "vbios", "vbios=x:96.00.61.00.01", "hca_fw=mlx5_0:"])
def test_bad_fault_arguments_are_usage_errors(arg: str) -> None:
    with pytest.raises(UsageError):
        parse_fault(arg)


def test_faults_accumulate() -> None:
    f = merge_faults({}, parse_fault("hca_down=mlx5_1"))
    f = merge_faults(f, parse_fault("hca_down=mlx5_2"))
    f = merge_faults(f, parse_fault("hca_rate=mlx5_3:200"))
    f = merge_faults(f, parse_fault("hca_rate=mlx5_4:100"))
    f = merge_faults(f, parse_fault("xid=79"))
    f = merge_faults(f, parse_fault("xid=79"))  # same event twice is one entry
    assert f == {"hca_down": ["mlx5_1", "mlx5_2"], "hca_rate": {"mlx5_3": 200, "mlx5_4": 100},
                 "xid": [{"gpu": 0, "code": 79}]}
    r = hwspec.resolve({"node": "n", "faults": f})
    assert sum(1 for h in r["hcas"] if h["ports"][0]["state"] == "DOWN") == 2


def test_firmware_faults_change_what_the_gpus_and_hcas_report() -> None:
    r = hwspec.resolve({"node": "n", "faults": merge_faults(parse_fault("vbios=3:96.00.61.00.01"),
                                                             parse_fault("hca_fw=mlx5_2:28.39.1002"))})
    assert [g["vbios"] == "96.00.61.00.01" for g in r["gpus"]].count(True) == 1 and r["gpus"][3]["vbios"] == \
        "96.00.61.00.01"
    assert {h["name"]: h["fw_ver"] for h in r["hcas"]}["mlx5_2"] == "28.39.1002"
    assert len({h["fw_ver"] for h in r["hcas"]}) == 2
    every = hwspec.resolve({"node": "n", "faults": parse_fault("vbios=96.00.61.00.01")})
    assert {g["vbios"] for g in every["gpus"]} == {"96.00.61.00.01"}
    with pytest.raises(hwspec.HwSpecError, match="faults.vbios"):
        hwspec.resolve({"node": "n", "faults": {"vbios": {"9": "1.0"}}})
    with pytest.raises(hwspec.HwSpecError, match="faults.hca_fw"):
        hwspec.resolve({"node": "n", "faults": {"hca_fw": "bad version"}})
