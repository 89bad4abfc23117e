"""``edgerun kiosk``: camera -> INT8 model -> pass/reject to the PLC, one decision per part, with a dashboard and an audit trail."""
