"""The pizza shop's event catalog: what each service receives and sends, for
``consumerkit asyncapi consumerkit.demo.catalog:catalog`` (docs/asyncapi.md shows the result).

The demo's topics carry the run's id (``pizza-orders-<run>``): here it is the channel
parameter ``{run}``. The handlers are the demo's own, so the document follows the code.
"""

from __future__ import annotations

from .. import __version__
from ..catalog import EventCatalog, Receives, Sends
from . import shop

ORDERS = shop.orders_topic("{run}")
PAYMENTS = shop.payments_topic("{run}")
_SCHEMA = shop.schema_name("run")  # the handlers' SQL names it; no SQL runs here

catalog = EventCatalog(
    title="The pizza shop",
    version=__version__,
    description="The shop writes each order and its events through its outbox; billing "
                "charges each order once and sends payment.completed through its own "
                "outbox; inventory reserves stock; the shop marks orders paid.",
    receives=[
        Receives("billing", [ORDERS], [shop.billing_handlers(_SCHEMA)]),
        Receives("inventory", [ORDERS], [shop.inventory_handlers(_SCHEMA)]),
        Receives("shop", [PAYMENTS], [shop.shop_handlers(_SCHEMA)]),
    ],
    sends=[
        Sends("shop", "order.placed", shop.OrderPlaced, "order", ORDERS),
        Sends("shop", "order.topping_added", shop.ToppingAdded, "order", ORDERS),
        Sends("shop", "order.submitted", shop.OrderSubmitted, "order", ORDERS),
        Sends("billing", "payment.completed", shop.PaymentCompleted, "payment", PAYMENTS),
    ],
)
