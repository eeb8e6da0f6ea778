"""The reasoning key every ingress replica shares: the operator's, or one the deployment
generates once and keeps in the response store.

A blob sealed on one ingress replica must open on every other (a compaction item that does not
is a 400; reasoning that does not is dropped) and after a restart, so each replica's vault holds
the same keys:

- With no operator key, the first replica to start proposes a random key to the store and every
  replica, then and after, gets the one the store kept (`ResponseStore.shared_secret`: an
  insert-if-absent, so replicas starting at once cannot choose different keys).
- With an operator key (``secrets.reasoning_key``, $SERVE_APP_REASONING_KEY), it seals. It may be
  a comma-separated list, for rotation: the first seals, every one opens. A key the deployment
  generated before the operator set one still opens (it is read from the store, never made
  then), so setting a key does not break the blobs clients already hold; deleting its row
  (``DELETE FROM server_secrets WHERE name = 'reasoning_key'``) retires it.
"""

from __future__ import annotations

import logging
import secrets

from serve_app.config import SecretArgs
from serve_app.harmony.reasoning_vault import ReasoningVault
from serve_app.store.base import ResponseStore

logger = logging.getLogger(__name__)

# The row of the generated key in the store's ``server_secrets``.
GENERATED_KEY_NAME = "reasoning_key"


async def shared_vault(secrets_args: SecretArgs, store: ResponseStore) -> ReasoningVault:
    """The vault of this deployment's reasoning keys (``secrets_args`` already `resolved`)."""
    operator_keys = secrets_args.reasoning_keys()
    if not operator_keys:
        generated = await store.shared_secret(GENERATED_KEY_NAME, secrets.token_urlsafe(32))
        if generated is None:  # a store that broke its contract: never shared by accident
            raise RuntimeError("the response store kept no reasoning key")
        logger.info("reasoning key: the deployment's own, kept in the response store")
        return ReasoningVault(generated)
    generated = await store.shared_secret(GENERATED_KEY_NAME, None)
    older = [generated] if generated is not None and generated not in operator_keys else []
    logger.info(
        "reasoning key: the operator's (%d in the list%s)",
        len(operator_keys),
        ", and the deployment's earlier generated key opens" if older else "",
    )
    return ReasoningVault(*operator_keys, *older)
