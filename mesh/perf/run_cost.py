"""What a training run costs: wall time and GPU-hours from the planner's step time, rented by the
GPU-hour or on owned servers (depreciation, power, cooling), and the utilisation above which owning
is cheaper.

Defaults, with their sources (per GPU type, see also `triskele.mesh.perf.hardware` for rental prices and
board power):
- server price per 8-GPU server: DGX A100 199,000 USD (NVIDIA's launch price, May 2020); DGX H100
  about 270,000 USD (2023 estimate); DGX B200 515,000 USD (launch price quoted on
  vengineer.hatenablog.com, 2025-03); H200 assumed equal to the DGX H100 estimate (same board,
  more HBM; no price found); B300 none (pass `--server-price`).
- depreciation: 5 years (hyperscalers depreciate servers over 5-6 years).
- host share: 575 W per GPU: a DGX H100 draws 10.2 kW at most (datasheet), of which 8 x 700 W are
  the GPU boards; the rest (CPUs, memory, NICs, NVSwitches, fans) divided by 8.
- PUE 1.56 (Uptime Institute global survey, 2024); electricity 0.08 USD/kWh (US industrial
  average, about 0.07-0.09, EIA 2023).
"""

from __future__ import annotations

import dataclasses
import math

from triskele.mesh.perf.hardware import Gpu

HOURS_PER_YEAR = 8766.0
GPUS_PER_SERVER = 8
SERVER_PRICE_USD = {"A100 SXM 80GB": 199_000.0, "H100 SXM": 270_000.0, "H200 SXM": 270_000.0, "B200": 515_000.0}
DEFAULT_YEARS = 5.0
HOST_WATTS_PER_GPU = 575.0
DEFAULT_PUE = 1.56
DEFAULT_KWH_PRICE = 0.08


@dataclasses.dataclass(frozen=True)
class Ownership:
    """Rented and owned prices of one GPU-hour."""

    price_per_gpu_hour: float
    server_price: float
    years: float = DEFAULT_YEARS
    pue: float = DEFAULT_PUE
    kwh_price: float = DEFAULT_KWH_PRICE
    gpu_watts: float = 700.0
    host_watts: float = HOST_WATTS_PER_GPU
    utilisation: float = 1.0
    """Share of the year the owned servers are busy (their depreciation is spread over those hours)."""

    @property
    def energy_per_gpu_hour(self) -> float:
        return (self.gpu_watts + self.host_watts) / 1000 * self.pue * self.kwh_price

    @property
    def capital_per_gpu_year(self) -> float:
        return self.server_price / GPUS_PER_SERVER / self.years

    @property
    def owned_per_gpu_hour(self) -> float:
        return self.capital_per_gpu_year / (HOURS_PER_YEAR * self.utilisation) + self.energy_per_gpu_hour

    @property
    def break_even_hours_per_year(self) -> float:
        """Busy hours per year above which owning costs less than renting (inf: never)."""
        margin = self.price_per_gpu_hour - self.energy_per_gpu_hour
        return self.capital_per_gpu_year / margin if margin > 0 else math.inf


def ownership(gpu: Gpu, price_per_gpu_hour: float | None = None, server_price: float | None = None,
              years: float = DEFAULT_YEARS, pue: float = DEFAULT_PUE, kwh_price: float = DEFAULT_KWH_PRICE,
              host_watts: float = HOST_WATTS_PER_GPU, utilisation: float = 1.0) -> Ownership:
    """The defaults for `gpu`, with any of them overridden; a missing price is an error naming the flag."""
    price = gpu.price_per_gpu_hour if price_per_gpu_hour is None else price_per_gpu_hour
    server = SERVER_PRICE_USD.get(gpu.name) if server_price is None else server_price
    if price is None:
        raise ValueError(f"no default rental price for {gpu.name}; pass --price-per-gpu-hour USD")
    if server is None:
        raise ValueError(f"no default server price for {gpu.name}; pass --server-price USD (per 8-GPU server)")
    checks = {"--price-per-gpu-hour": price, "--server-price": server, "--years": years, "--pue": pue,
              "--utilisation": utilisation}
    for flag, value in checks.items():
        if not value > 0:
            raise ValueError(f"{flag} must be positive, got {value}")
    if pue < 1 or utilisation > 1 or kwh_price < 0 or host_watts < 0:
        raise ValueError(f"--pue must be >= 1 (got {pue}), --utilisation in (0, 1] (got {utilisation}), "
                         f"--kwh-price and host watts >= 0 (got {kwh_price}, {host_watts})")
    return Ownership(price, server, years, pue, kwh_price, gpu.board_power_w, host_watts, utilisation)


def run_cost(step_s: float, devices: int, global_batch: int, train_images: int, owning: Ownership) -> dict:
    """Wall time, GPU-hours and both costs of training on `train_images` images."""
    steps = math.ceil(train_images / global_batch)
    hours = steps * step_s / 3600
    gpu_hours = hours * devices
    return {"steps": steps, "hours": hours, "gpu_hours": gpu_hours,
            "cost_rent_usd": gpu_hours * owning.price_per_gpu_hour,
            "cost_own_usd": gpu_hours * owning.owned_per_gpu_hour,
            "break_even_hours_per_year": owning.break_even_hours_per_year}
