"""What a storage client raised, as one line: :class:`StorageError` and its translation.

Every call :class:`readers.storage.remote.RemoteFolder` makes into fsspec turns what the
storage client raised (botocore's ``EndpointConnectionError``, aiohttp's
``ServerDisconnectedError``, a ``PermissionError``...) into a :class:`StorageError` that
names the URL and the cause in one line; the original stays chained as its ``__cause__``.
The client libraries are optional imports, so their exceptions are told apart by the names
of their classes (their documented exception types) and by the S3 error code they carry.
"""

from __future__ import annotations

import re
import socket
from urllib.parse import urlsplit

from readers.spec import DatasetError

__all__ = ["StorageError", "refused_credentials", "storage_error", "timed_out"]


class StorageError(DatasetError):
    """Object storage could not be used: unreachable, no credentials, credentials refused,
    permission denied, a connection lost or a server that stopped answering. The message
    names the URL and the cause; ``url`` and ``cause`` hold them, also after a DataLoader
    worker re-raised it (torch rebuilds it from its traceback's text: both are read back
    from the original message's last line)."""

    def __init__(self, message: str, *, url: str | None = None, cause: str | None = None) -> None:
        super().__init__(message)
        if url is None and cause is None:
            url, cause = _from_worker_message(message)
        self.url, self.cause = url, cause


# The two shapes of a StorageError's message: "URL: CAUSE" and the no-credentials one.
_URL_AND_CAUSE = re.compile(r"(\S+?://\S*?): (.+)")
_NO_CREDENTIALS_MESSAGE = re.compile(r"no credentials for (\S+) \(.+\)")


def _from_worker_message(message: str) -> tuple[str | None, str | None]:
    """``url`` and ``cause`` of the StorageError whose traceback torch's ExceptionWrapper
    put in ``message`` ("Caught StorageError in DataLoader worker process 0. Original
    Traceback ... StorageError: URL: CAUSE"); (None, None) for any other message."""
    if not message.startswith(f"Caught {StorageError.__name__} "):
        return None, None
    last = message.rstrip().rsplit("\n", 1)[-1]
    original = last.split(f"{StorageError.__name__}: ", 1)[-1]
    if match := _NO_CREDENTIALS_MESSAGE.fullmatch(original):
        return match[1], "no credentials"
    if match := _URL_AND_CAUSE.fullmatch(original):
        return match[1], match[2]
    return None, None


_NO_CREDENTIALS = {
    "NoCredentialsError",
    "PartialCredentialsError",
    "CredentialRetrievalError",
    "DefaultCredentialsError",  # google-auth
    "ClientAuthenticationError",  # azure-core
}
# S3's error codes for a request whose credentials the server does not accept (an access
# key it does not know, a signature made with another secret, an expired session token):
# answered 403 as "permission denied" is, which s3fs turns into the same PermissionError.
_CREDENTIALS_REFUSED = {
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
}
_CONNECTION_LOST = {
    "ConnectionResetError",
    "BrokenPipeError",
    "ServerDisconnectedError",
    "ClientPayloadError",
    "ConnectionClosedError",
    "IncompleteRead",
}
_CREDENTIAL_HINTS = {"s3": "set AWS_* or ~/.aws", "s3a": "set AWS_* or ~/.aws"}


def storage_error(url: str, error: BaseException) -> StorageError:
    """The :class:`StorageError` for what a storage client raised while using ``url``."""
    chain = _chain(error)
    names = {c.__name__ for e in chain for c in type(e).__mro__}
    scheme = url.split("://", 1)[0]
    if names & _NO_CREDENTIALS:
        hint = _CREDENTIAL_HINTS.get(scheme, f"configure credentials for {scheme}://")
        return StorageError(f"no credentials for {url} ({hint})", url=url, cause="no credentials")
    code = _error_code(chain)
    if code in _CREDENTIALS_REFUSED:
        hint = _CREDENTIAL_HINTS.get(scheme, f"check the credentials for {scheme}://")
        cause = f"the server refused the credentials ({code}: {_one_line(error)}; {hint})"
        return StorageError(f"{url}: {cause}", url=url, cause=cause)
    if any(isinstance(e, PermissionError) for e in chain):
        cause = f"permission denied ({_one_line(error)})"
        return StorageError(f"{url}: {cause}", url=url, cause=cause)
    why = _connection_fault(chain, names)
    if why is not None:
        endpoint = _endpoint(chain)
        cause = f"cannot reach the storage endpoint{f' {endpoint}' if endpoint else ''} ({why})"
        return StorageError(f"{url}: {cause}", url=url, cause=cause)
    cause = f"storage error ({type(error).__name__}: {_one_line(error)})"
    return StorageError(f"{url}: {cause}", url=url, cause=cause)


def refused_credentials(error: BaseException) -> bool:
    """True if the server said why it refused ``error``'s request: the credentials (a
    403 to a HEAD request has no body, so it cannot say; a listing's does)."""
    return _error_code(_chain(error)) in _CREDENTIALS_REFUSED


def timed_out(url: str, seconds: float, setting: str) -> StorageError:
    """The :class:`StorageError` for a request the server did not answer within its time
    limit (``seconds``, set by ``setting``)."""
    cause = f"no answer from the storage server within {seconds:g} s (timed out; {setting})"
    return StorageError(f"{url}: {cause}", url=url, cause=cause)


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and the exceptions it was raised from or during, outermost first."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def _error_code(chain: list[BaseException]) -> str | None:
    """The S3 error code a botocore ``ClientError`` in ``chain`` carries, if any."""
    for e in chain:
        response = getattr(e, "response", None)
        if isinstance(response, dict) and isinstance(response.get("Error"), dict):
            return response["Error"].get("Code")
    return None


def _connection_fault(chain: list[BaseException], names: set[str]) -> str | None:
    """Why a connection failed, in words, or None if this is no connection fault."""
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "connection refused"
    if any(isinstance(e, socket.gaierror) for e in chain):
        return "unknown host"
    if names & _CONNECTION_LOST:
        return "connection lost"
    if any(isinstance(e, TimeoutError) for e in chain) or any("Timeout" in n for n in names):
        return "timed out"
    if any(isinstance(e, ConnectionError) for e in chain) or "EndpointConnectionError" in names:
        return "cannot connect"
    return None


def _endpoint(chain: list[BaseException]) -> str | None:
    """``scheme://host:port`` of the server a client failed to reach, where it says."""
    for e in chain:
        url = getattr(e, "kwargs", {}).get("endpoint_url")  # botocore's errors
        if isinstance(url, str) and "://" in url:
            parts = urlsplit(url)
            return f"{parts.scheme}://{parts.netloc}"
        host, port = getattr(e, "host", None), getattr(e, "port", None)  # aiohttp's
        if isinstance(host, str) and port:
            return f"{host}:{port}"
    return None


def _one_line(error: BaseException) -> str:
    return re.sub(r"\s+", " ", str(error)).strip() or type(error).__name__
