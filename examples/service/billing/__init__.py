"""The billing service: it charges every created order once (see ``billing.app``)."""
