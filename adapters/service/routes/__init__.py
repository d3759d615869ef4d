"""The HTTP API's routers, assembled by `adapters.service.api.create_app`: `ingest`
(gateways' events; `bodies` reads and splits them), `manage` (profiles and subscribers),
`gateways` (the API-key check), `operations` (health, metrics, docs), `late` (the late
output); `base` holds what they share."""
