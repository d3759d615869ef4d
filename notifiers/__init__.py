"""Delivery of notifications: a durable Redis outbox, signed webhooks and SMTP mail.

`notifiers.store` is the Redis contract (keys, `enqueue`, `put_subscriber`); `notifiers.worker`
the delivery worker; `ens.commands.notifications` holds the ``ens notifications`` commands. See docs/notifiers.md.
"""
