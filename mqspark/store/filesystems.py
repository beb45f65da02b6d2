"""pyarrow filesystems for where queue managers live: local folders and object stores.

delta-rs reaches an object store itself, with the storage options a queue manager was opened with
or the standard environment variables. mqspark also reads and writes some files directly (a put's
data files, log entries, the instance registry) through pyarrow's filesystems; this module gives
them the same credentials, under delta-rs's option names:

- Azure Blob Storage and ADLS (``az://container/path``, ``abfs[s]://container@account.dfs.core.windows.net/path``):
  ``account_name``, ``account_key``, ``sas_token``, ``client_id``/``client_secret``/``tenant_id``,
  ``endpoint`` (an emulator or a sovereign cloud, such as ``http://127.0.0.1:10000/devstoreaccount1``)
  and ``use_emulator``, or their ``AZURE_STORAGE_*`` environment variables (every alias delta-rs
  accepts);
- Amazon S3 and S3-compatible stores (``s3://bucket/path``, ``s3a://``): ``aws_access_key_id``,
  ``aws_secret_access_key``, ``aws_session_token``, ``aws_region``, ``aws_endpoint_url`` (an
  S3-compatible store or an emulator) and ``aws_allow_http``, or their ``AWS_*`` environment
  variables;
- other stores (``gs://``): pyarrow's own resolution from the URI and the environment.

Options given to a queue manager are remembered by its root, so every file under the root is
reached with them; a process that was given none (a Spark executor) uses the environment.
"""

from __future__ import annotations

import functools
import os
from urllib.parse import urlparse

import pyarrow.fs as pafs

from mqspark.errors import MQValidationError

# delta-rs's (object_store's) names for each Azure setting, as storage options or, upper-cased,
# environment variables.
_AZURE_KEYS = {
    "account_name": ("azure_storage_account_name", "account_name"),
    "account_key": (
        "azure_storage_account_key",
        "azure_storage_access_key",
        "azure_storage_master_key",
        "master_key",
        "account_key",
        "access_key",
    ),
    "sas_token": ("azure_storage_sas_key", "azure_storage_sas_token", "sas_key", "sas_token"),
    "client_id": ("azure_storage_client_id", "azure_client_id", "client_id"),
    "client_secret": ("azure_storage_client_secret", "azure_client_secret", "client_secret"),
    "tenant_id": (
        "azure_storage_tenant_id",
        "azure_storage_authority_id",
        "azure_tenant_id",
        "azure_authority_id",
        "tenant_id",
        "authority_id",
    ),
    "endpoint": ("azure_storage_endpoint", "azure_endpoint", "endpoint"),
    "use_emulator": ("azure_storage_use_emulator", "use_emulator"),
}
_AZURE_SCHEMES = ("az", "azure", "abfs", "abfss", "adl")
# The same for S3 (the environment variables are the AWS_* ones of the AWS SDKs).
_S3_KEYS = {
    "access_key": ("aws_access_key_id", "access_key_id"),
    "secret_key": ("aws_secret_access_key", "secret_access_key"),
    "session_token": ("aws_session_token", "session_token", "token"),
    "region": ("aws_region", "region", "aws_default_region"),
    "endpoint": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"),
    "allow_http": ("aws_allow_http", "allow_http"),
}
_S3_SCHEMES = ("s3", "s3a")
# The Azurite emulator's well-known account, as delta-rs uses it with ``use_emulator``.
_EMULATOR_ACCOUNT = "devstoreaccount1"
_EMULATOR_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_EMULATOR_URL = "http://127.0.0.1:10000"

_remembered: dict[str, dict[str, str]] = {}


def is_uri(location: str) -> bool:
    """True for object-store URIs (``s3://``, ``abfss://``...), false for local paths."""
    return len(urlparse(location).scheme) > 1


def is_local_file(location: str) -> bool:
    """True when ``location`` is a local path that holds a file (not a folder)."""
    return not is_uri(location) and os.path.exists(location) and not os.path.isdir(location)


def remember(root: str, storage_options: dict[str, str] | None) -> None:
    """Reach every file under ``root`` with ``storage_options`` from now on (in this process)."""
    if storage_options and is_uri(root):
        _remembered[root.rstrip("/")] = dict(storage_options)


def options_for(location: str) -> dict[str, str]:
    """The storage options remembered for the root that holds ``location`` (none: empty)."""
    matches = [root for root in _remembered if location == root or location.startswith(root + "/")]
    return _remembered[max(matches, key=len)] if matches else {}


# One for every local path: an idle streaming query's planner looks at its logs tens of times a second.
_LOCAL = pafs.LocalFileSystem()


def filesystem_of(location: str) -> tuple[pafs.FileSystem, str]:
    """pyarrow's filesystem for ``location`` and the path in it."""
    if not is_uri(location):
        return _LOCAL, location
    url = urlparse(location)
    if url.scheme in _S3_SCHEMES:
        settings = _settings(_S3_KEYS, "AWS", options_for(location))
        return _s3(tuple(sorted(settings.items()))), f"{url.netloc}{url.path}".rstrip("/")
    if url.scheme not in _AZURE_SCHEMES:
        return pafs.FileSystem.from_uri(location)
    container, _, host = url.netloc.partition("@")
    settings = _settings(_AZURE_KEYS, "AZURE", options_for(location))
    account = settings.get("account_name") or host.split(".")[0] or None
    return _azure(account, tuple(sorted(settings.items()))), f"{container}{url.path}".rstrip("/")


def _settings(keys: dict[str, tuple[str, ...]], prefix: str, options: dict[str, str]) -> dict[str, str]:
    """Each setting of ``keys``, from ``options`` first, then the environment variables that start
    with ``prefix``."""
    given = {key.lower(): value for key, value in options.items()}
    environment = {key.lower(): value for key, value in os.environ.items() if key.startswith(prefix)}
    settings = {}
    for setting, names in keys.items():
        for source in (given, environment):
            value = next((source[name] for name in names if name in source), None)
            if value is not None:
                settings[setting] = value
                break
    return settings


@functools.lru_cache(maxsize=16)
def _azure(account: str | None, settings: tuple[tuple[str, str], ...]) -> pafs.AzureFileSystem:
    values = dict(settings)
    values.pop("account_name", None)
    endpoint = values.pop("endpoint", None)
    if values.pop("use_emulator", "false").lower() in ("true", "1") and endpoint is None:
        endpoint = f"{os.environ.get('AZURITE_BLOB_STORAGE_URL', _EMULATOR_URL).rstrip('/')}/{_EMULATOR_ACCOUNT}"
        account = account or _EMULATOR_ACCOUNT
        values.setdefault("account_key", _EMULATOR_KEY)
    if endpoint is not None:
        url = urlparse(endpoint)
        values.update(
            blob_storage_authority=url.netloc,
            blob_storage_scheme=url.scheme,
            dfs_storage_authority=url.netloc,
            dfs_storage_scheme=url.scheme,
        )
    if account is None:
        raise MQValidationError(
            "an Azure location needs an account: storage option account_name, AZURE_STORAGE_ACCOUNT_NAME, "
            "or abfss://container@account.dfs.core.windows.net/path"
        )
    return pafs.AzureFileSystem(account, **values)


@functools.lru_cache(maxsize=16)
def _s3(settings: tuple[tuple[str, str], ...]) -> pafs.S3FileSystem:
    values = dict(settings)
    endpoint = values.pop("endpoint", None)
    allow_http = values.pop("allow_http", "false").lower() in ("true", "1")
    if endpoint is not None:
        url = urlparse(endpoint)
        values.update(
            endpoint_override=url.netloc or url.path, scheme=url.scheme or ("http" if allow_http else "https")
        )
    return pafs.S3FileSystem(**values)
