"""The webhook wire contract both ends share: the headers an event travels in
(:mod:`.headers`), their signature (:mod:`.signature`) and what a status code means
(:mod:`.status`). The sender is :class:`~consumerkit.outbox.webhook.WebhookSink`, the receiver
:class:`~consumerkit.webhook.WebhookReceiver`."""
