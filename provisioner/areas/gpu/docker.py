"""Docker: Docker CE from Docker's repository or the distribution's docker.io (pure; the
docker role)."""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.areas.gpu.tables import (
    DOCKER_CE_PACKAGES,
    DOCKER_DISTRO_PACKAGES,
    DOCKER_REPO,
    DOCKER_SOURCES,
    GpuStackError,
    OsName,
    check_os,
    resolve_source,
)


@dataclass(frozen=True)
class DockerPlan:
    os: OsName
    source: str
    packages: tuple[str, ...]
    repo_url: str | None
    repo_suite: str | None


# --------------------------------------------------------------------------- docker
def resolve_docker(os_name: str, source: str = "auto") -> DockerPlan:
    os_ = check_os(os_name)
    src = resolve_source(os_, "docker", source)
    if src not in DOCKER_SOURCES:
        raise GpuStackError(f"unknown docker source {src!r}; use auto, {', '.join(DOCKER_SOURCES)}")
    if src == "docker-ce":
        url, suite = DOCKER_REPO[os_]
        return DockerPlan(os=os_, source=src, packages=DOCKER_CE_PACKAGES, repo_url=url, repo_suite=suite)
    return DockerPlan(os=os_, source=src, packages=DOCKER_DISTRO_PACKAGES, repo_url=None, repo_suite=None)
