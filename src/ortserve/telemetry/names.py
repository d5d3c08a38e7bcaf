"""Attribute and instrument names, shared by the writer side (otel.py) and the readers
(summary, tests). OpenTelemetry GenAI/HTTP semantic-convention names where one exists."""

ROUTE = "http.route"
STATUS_CODE = "http.response.status_code"
MODEL = "gen_ai.request.model"
PROVIDER = "gen_ai.provider.name"
EXECUTION_PROVIDER = "ortserve.execution_provider"
REQUEST_ID = "ortserve.request_id"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
FINISH_REASONS = "gen_ai.response.finish_reasons"
TTFT = "ortserve.ttft_s"
TPOT = "ortserve.tpot_s"
STATUS = "ortserve.status"            # "ok" or "error"
ERROR_TYPE = "error.type"
PROMPT = "gen_ai.prompt"              # only with telemetry_content
COMPLETION = "gen_ai.completion"      # only with telemetry_content
TOKEN_TYPE = "gen_ai.token.type"
FINISH_REASON = "gen_ai.response.finish_reason"  # metric attribute (one value)

SCOPE = "ortserve"

M_REQUESTS = "ortserve.requests"
M_DURATION = "gen_ai.server.request.duration"
M_TTFT = "gen_ai.server.time_to_first_token"
M_TPOT = "gen_ai.server.time_per_output_token"
M_TOKENS = "ortserve.tokens"
M_WAITING = "ortserve.engine.waiting"
M_RUNNING = "ortserve.engine.running"
M_TPS = "ortserve.engine.tokens_per_second"
M_KV = "ortserve.engine.kv_cache_usage"
M_ENGINE_OUTPUT = "ortserve.engine.output_tokens"

# Histogram bucket bounds (seconds), from the GenAI semantic conventions.
DURATION_BOUNDS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BOUNDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
