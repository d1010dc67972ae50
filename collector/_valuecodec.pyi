from typing import Any

import numpy.typing as npt

# C-contiguous arrays: float64 values, int32 series_idx, int8 top (the series' scratch, filled
# with -1), and the outputs float64, int64 and int8 (collector/native/valuecodecmodule.c).
def encode(
    values: npt.NDArray[Any],
    series_idx: npt.NDArray[Any] | None,
    top: npt.NDArray[Any],
    float_out: npt.NDArray[Any],
    mantissa_out: npt.NDArray[Any],
    scale_out: npt.NDArray[Any],
    /,
) -> None: ...
