"""The HTTP edge of `provision report usage`: Prometheus' range queries (its HTTP API,
``/api/v1/query_range``), each bounded by a timeout. No proxy: Prometheus is on the cluster's
management network, which the control machine reaches directly (as it does over SSH)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from provisioner.errors import ProvisionError

MAX_ANSWER = 512 * 1024 * 1024  # bytes read from one answer at most
QueryRange = Callable[[str, float, float, float], Mapping[str, Any]]


def query_range(url: str, timeout: float) -> QueryRange:
    """A function (expr, start, end, step) -> Prometheus' JSON answer; raises ProvisionError
    when Prometheus cannot be reached or answers with something that is not its JSON."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    base = url.rstrip("/") + "/api/v1/query_range"

    def query(expr: str, start: float, end: float, step: float) -> Mapping[str, Any]:
        data = urllib.parse.urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                       "step": f"{step:g}", "timeout": f"{max(1, int(timeout))}s"}).encode()
        request = urllib.request.Request(base, data=data, method="POST",
                                         headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with opener.open(request, timeout=timeout) as resp:
                body = resp.read(MAX_ANSWER)
        except urllib.error.HTTPError as exc:  # 400/422/503 carry Prometheus' own error as JSON
            body = exc.read(MAX_ANSWER)
            if not body.startswith(b"{"):
                raise ProvisionError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ProvisionError(f"{url}: {reason}") from None
        try:
            answer: Mapping[str, Any] = json.loads(body)
        except ValueError:
            raise ProvisionError(f"{url}: the answer is not JSON (is this Prometheus?)") from None
        return answer

    return query
