"""The ``monitoring:`` section (Prometheus, Alertmanager receivers, Grafana, the idle-GPU alert)
and ``cost:``, the GPU prices of `provision report usage`."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from provisioner.manifest.fields import EmailAddress, Strict, no_inline, secret_ref

PROM_DURATION_RE = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")
PROM_SIZE_RE = re.compile(r"^\d+(B|KB|MB|GB|TB|PB|EB)$")


def _prom_duration(value: str) -> str:
    if not value or not PROM_DURATION_RE.match(value):
        raise ValueError(f"{value!r} is not a Prometheus duration like 30s, 15d or 1w")
    return value


PromDuration = Annotated[str, AfterValidator(_prom_duration)]


class EmailReceiver(Strict):
    to: list[EmailAddress] = Field(min_length=1)
    sender: EmailAddress = Field(description="From: address")
    smarthost: str = Field(description="SMTP server as host:port")
    require_tls: bool = True
    auth_username: str | None = None
    auth_password_env: str | None = None
    auth_password_file: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _inline(cls, data: Any) -> Any:
        return no_inline(data, ("auth_password",), "SMTP passwords")

    @field_validator("smarthost")
    @classmethod
    def _smarthost(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or any(c.isspace() for c in v):
            raise ValueError(f"{v!r} is not host:port (e.g. mail.example.org:587)")
        return v

    @model_validator(mode="after")
    def _secret(self) -> EmailReceiver:
        secret_ref("email", "auth_password", self.auth_password_env, self.auth_password_file)
        has_password = self.auth_password_env is not None or self.auth_password_file is not None
        if has_password and not self.auth_username:
            raise ValueError("an SMTP password needs auth_username")
        return self


class WebhookReceiver(Strict):
    url: str | None = Field(default=None, description="a URL holding no secret (e.g. an internal relay)")
    url_env: str | None = Field(default=None, description="URL with a token in it, from this variable")
    url_file: str | None = None
    bearer_token_env: str | None = None
    bearer_token_file: str | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^\s]+$", v):
            raise ValueError(f"{v!r} is not an http(s):// URL")
        return v

    @model_validator(mode="after")
    def _one_url(self) -> WebhookReceiver:
        given = [k for k in ("url", "url_env", "url_file") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of url, url_env or url_file")
        secret_ref("webhook", "url", self.url_env, self.url_file)
        secret_ref("webhook", "bearer_token", self.bearer_token_env, self.bearer_token_file)
        return self


Severity = Literal["critical", "warning"]


def _all_severities() -> list[Severity]:
    return ["critical", "warning"]


class AlertReceiver(Strict):
    name: str
    severities: list[Severity] = Field(default_factory=_all_severities, min_length=1, description="alerts sent here")
    email: EmailReceiver | None = None
    webhook: WebhookReceiver | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.match(r"^[a-z][a-z0-9-]{0,40}$", v):
            raise ValueError(f"{v!r}: a receiver name uses lower-case letters, digits and '-'")
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> AlertReceiver:
        if (self.email is None) == (self.webhook is None):
            raise ValueError("a receiver has exactly one of email or webhook")
        return self


def _ratio(value: Any) -> Any:
    """A share in (0, 1]: a number (not a YAML boolean), not a percentage."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} is not a number: give a ratio in (0, 1], e.g. 0.05 for 5%")
    if not 0 < value <= 1:
        raise ValueError(f"{value!r} is not a ratio in (0, 1] (5% is 0.05)")
    return float(value)


Ratio = Annotated[float, BeforeValidator(_ratio)]


class GpuJobIdle(Strict):
    """The GpuJobIdle alert: a Slurm job kept every GPU it holds on a node under a utilization
    for a time; optionally also mailed to the job's user."""

    utilization_below: Ratio = Field(default=0.05, description="the share of the time a GPU is busy, in (0, 1]")
    idle_for: PromDuration = Field(default="60m", description="how long every GPU of the job stays under it")
    notify_users: str | None = Field(
        default=None, description="an e-mail receiver of monitoring.receivers: the alert also goes to the job's "
        "user (users[].email) through its server, sender and login; absent: to the receivers only")


class Monitoring(Strict):
    nodes: list[str] = Field(
        default_factory=list, description="Prometheus/Alertmanager/Grafana nodes; default @services, else the head"
    )
    retention: PromDuration = "30d"
    retention_size: str | None = Field(default=None, description="cap on the TSDB size, e.g. 200GB")
    scrape_interval: PromDuration = "30s"
    gpu_metrics: Literal["dcgm", "nvidia-smi"] = Field(
        default="dcgm", description="NVIDIA's DCGM exporter, or our nvidia-smi collector"
    )
    grafana: bool = True
    receivers: list[AlertReceiver] = Field(default_factory=list)
    gpu_job_idle: GpuJobIdle = Field(default_factory=GpuJobIdle)

    @field_validator("retention_size")
    @classmethod
    def _size(cls, v: str | None) -> str | None:
        if v is not None and not PROM_SIZE_RE.match(v):
            raise ValueError(f"{v!r} is not a size like 500GB or 2TB")
        return v


class GpuCost(Strict):
    """What one GPU of a model costs per hour it is held: a price per GPU-hour (a rate that
    includes power), or its purchase price written off over a period plus the power it drew."""

    price_per_gpu_hour: float | None = Field(default=None, gt=0, description="a rate per GPU-hour held, "
                                             "power included")
    purchase_price: float | None = Field(default=None, gt=0, description="per GPU, its share of the server "
                                         "included")
    depreciation_years: float | None = Field(default=None, gt=0, le=20, description="the purchase price is "
                                             "written off evenly over this many years (8766 h each)")
    power_price_per_kwh: float | None = Field(default=None, ge=0, description="price of the energy the GPUs "
                                              "drew (measured by the GPU metrics)")

    @model_validator(mode="after")
    def _one_way(self) -> GpuCost:
        owned = (self.purchase_price, self.depreciation_years, self.power_price_per_kwh)
        if self.price_per_gpu_hour is not None:
            if any(v is not None for v in owned):
                raise ValueError("give either price_per_gpu_hour, or purchase_price with depreciation_years "
                                 "and power_price_per_kwh; not both")
            return self
        missing = [name for name, v in zip(("purchase_price", "depreciation_years", "power_price_per_kwh"),
                                           owned, strict=True) if v is None]
        if missing:
            raise ValueError("give price_per_gpu_hour, or purchase_price with depreciation_years and "
                             f"power_price_per_kwh (missing: {', '.join(missing)})")
        return self


class Cost(Strict):
    """Prices for `provision report usage`, per GPU model (the nodes' hardware.gpu.model)."""

    currency: str = Field(default="EUR", description="the currency the prices are in (shown, not converted)")
    gpus: dict[str, GpuCost] = Field(min_length=1, description="GPU model -> its price")

    @field_validator("currency")
    @classmethod
    def _currency(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z$\u20ac\u00a3\u00a5]{1,8}$", v):
            raise ValueError(f"{v!r}: a currency is a short code or sign such as EUR, USD or $")
        return v
