"""BMC control: one small interface (:class:`Bmc`), Redfish and IPMI drivers, and the
operator operations behind ``provision bmc``."""

from provisioner.bmc.base import (
    Bmc,
    BmcError,
    BootConfirmation,
    BootMode,
    BootOverride,
    BootTarget,
    CredentialsError,
    PowerAction,
    PowerState,
    UnreachableError,
    wait_for_power,
)
from provisioner.bmc.credentials import Secret, resolve_password
from provisioner.bmc.ops import BmcRow, bmc_answers, bmc_power, bmc_pxe, bmc_status, describe_boot, make_bmc

__all__ = [
    "Bmc",
    "BmcError",
    "BmcRow",
    "BootConfirmation",
    "BootMode",
    "BootOverride",
    "BootTarget",
    "CredentialsError",
    "PowerAction",
    "PowerState",
    "Secret",
    "UnreachableError",
    "bmc_answers",
    "bmc_power",
    "bmc_pxe",
    "bmc_status",
    "describe_boot",
    "make_bmc",
    "resolve_password",
    "wait_for_power",
]
