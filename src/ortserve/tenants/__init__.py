"""Several API keys, each its own tenant (issue 45): the key file, its reader and writer, and
who a request is (``Principal``). Below the server: it imports only ``errors``."""

from ortserve.tenants.keyfile import (
    ADMIN,
    SCOPES,
    USER,
    Forbidden,
    Key,
    KeyRing,
    Principal,
    add_key,
    hash_key,
    read_keys,
    revoke_key,
)

__all__ = ["ADMIN", "SCOPES", "USER", "Forbidden", "Key", "KeyRing", "Principal", "add_key", "hash_key",
           "read_keys", "revoke_key"]
