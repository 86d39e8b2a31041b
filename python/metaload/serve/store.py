"""What the front keeps for a while: each request's latest status (for GET /response/{id}) and
results waiting to be downloaded (under an unguessable id; deleted once downloaded or when their
time to live runs out)."""
import secrets
import threading
import time
from typing import Dict, Optional, Tuple


class Store:
    def __init__(self, ttl_s: float = 600.0):
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._status: Dict[str, Tuple[float, str]] = {}  # job id -> (expiry, ResponseModel JSON)
        self._results: Dict[str, Tuple[float, bytes]] = {}  # token -> (expiry, bytes)

    def set_status(self, job_id: str, text: str):
        with self._lock:
            self._status[job_id] = (time.monotonic() + self.ttl_s, text)

    def status(self, job_id: str) -> Optional[str]:
        with self._lock:
            entry = self._status.get(job_id)
        return None if entry is None or entry[0] <= time.monotonic() else entry[1]

    def put_result(self, data: bytes) -> str:
        token = secrets.token_urlsafe(32)  # 256 bits: the URL is the only credential
        with self._lock:
            self._results[token] = (time.monotonic() + self.ttl_s, data)
        return token

    def take_result(self, token: str) -> Optional[bytes]:
        """The result, once; None when downloaded already or past its time to live (even if the
        periodic sweep has not removed it yet)."""
        with self._lock:
            entry = self._results.pop(token, None)
        return None if entry is None or entry[0] <= time.monotonic() else entry[1]

    def results_held(self) -> int:
        with self._lock:
            return len(self._results)

    def expire(self):
        now = time.monotonic()
        with self._lock:
            for table in (self._status, self._results):
                for k in [k for k, (expiry, _) in table.items() if expiry <= now]:
                    del table[k]
