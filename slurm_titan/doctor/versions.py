"""Driver / CANN / torch_npu compatibility: a table from the documentation and the packages' own metadata.

`TORCH_NPU_TABLE` is the torch_npu 2.14.0 release notes (Ascend/pytorch, branch v2.14.0-26.2.0,
docs/zh/release_notes.md, TorchNPU 26.2.0 "版本说明"): its branch table pairs the wheel 2.14.0 with PyTorch
2.14.0 and CANN 9.2.0, and its "版本兼容性说明" table marks TorchNPU 26.2.X compatible ("Y") with CANN 8.5.X,
9.0.X, 9.1.X and 9.2.X. A torch other than the wheel's PyTorch, or a CANN outside the wheel's releases, is known
bad (a failure: torch_npu is built against those CANN releases only); a torch_npu outside the table is unknown (a
warning that names the table).

Driver against CANN: CANN's `<toolkit>/<arch>-linux/ascend_toolkit_install.info` lists in `compatible_version`
the driver releases it supports, by innerversion family (`[V100R001C15],[V100R001C18],...`); the driver's
`<ascend home>/driver/version.info` carries `Version=24.1.rc1`, `Innerversion=V100R001C15SPC006B220` and a
`compatible_version` of its own (recorded, not judged). File formats: Ascend/mind-cluster
docs/zh/faultdiag/user_guide.md (version.info and ascend_toolkit_install.info captures). A driver whose family
the toolkit does not list is known bad.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurm_titan.doctor.report import FAIL, WARN

TABLE = "torch_npu 2.14.0 release notes (Ascend/pytorch v2.14.0-26.2.0 docs/zh/release_notes.md)"


@dataclass(frozen=True)
class TorchNpuRelease:
    """One torch_npu wheel: the PyTorch it is built for, the CANN releases (major.minor) it is documented with."""

    torch: str
    cann: tuple[str, ...]
    recommended_cann: str


TORCH_NPU_TABLE = {"2.14.0": TorchNpuRelease("2.14.0", ("8.5", "9.0", "9.1", "9.2"), "9.2.0")}
_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")
_FAMILY = re.compile(r"^(V\d+R\d+C\d+)")
Row = tuple[str, str, str, str]
"""(check, found, expected, severity)"""


def release(version: str, parts: int = 3) -> str | None:
    """The first `parts` numbers of a version: `2.14.0.post1` -> `2.14.0`, `2.14.0+cpu` -> `2.14.0`,
    `8.1.RC1` (parts=2) -> `8.1`; None if it does not start with numbers."""
    match = _RELEASE.match(version)
    if match is None:
        return None
    return ".".join(number or "0" for number in match.groups()[:parts])


def parse_compatible(text: str) -> tuple[str, ...]:
    """`[V100R001C15],[V100R001C18]` -> ("V100R001C15", "V100R001C18")."""
    return tuple(item.strip().strip("[]") for item in text.split(",") if item.strip().strip("[]"))


def torch_npu_rows(torch: str | None, torch_npu: str | None, cann: str | None) -> list[Row]:
    """torch and CANN against the table entry of this torch_npu (nothing to say when one is missing:
    that is a failure of its own)."""
    if torch_npu is None:
        return []
    entry = TORCH_NPU_TABLE.get(release(torch_npu) or "")
    if entry is None:
        return [("torch_npu", f"torch_npu {torch_npu} is not in the table",
                 f"torch_npu {', '.join(TORCH_NPU_TABLE)} ({TABLE})", WARN)]
    rows: list[Row] = []
    if torch is not None and release(torch) != entry.torch:
        rows.append(("torch_npu", f"torch {torch} with torch_npu {torch_npu}",
                     f"torch {entry.torch} (the PyTorch torch_npu {torch_npu} is built for; {TABLE})", FAIL))
    if cann is not None and release(cann, 2) not in entry.cann:
        rows.append(("CANN", f"CANN {cann} with torch_npu {torch_npu} is not in the table",
                     f"CANN {entry.cann[0]}.X to {entry.cann[-1]}.X, recommended {entry.recommended_cann} "
                     f"({TABLE})", FAIL))
    return rows


def driver_rows(driver: dict[str, str] | None, cann: str | None, cann_compatible: str | None) -> list[Row]:
    """The driver against the families the toolkit's `compatible_version` lists (nothing to judge without both)."""
    families = parse_compatible(cann_compatible or "")
    inner = (driver or {}).get("Innerversion", "")
    family = _FAMILY.match(inner)
    if not families or family is None or family.group(1) in families:
        return []
    version = (driver or {}).get("Version", "?")
    return [("driver", f"driver {version} ({inner}) is not among CANN {cann}'s compatible drivers",
             f"a driver of {', '.join(families)} (compatible_version in CANN's ascend_toolkit_install.info)",
             FAIL)]
