"""Settings: the only module that reads the environment, `.env` and the config file.

Precedence: CLI flags > environment > `.env` > config file (`ortserve.toml` or
`ortserve.json` in the working directory, or the file named by ORTSERVE_CONFIG) > defaults.
Every setting has one name, one default and one line of documentation; `ortserve config`
prints them all.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

DEVICES = ("auto", "cpu", "cuda", "dml", "webgpu", "openvino")
DEVICE_ALIASES = {"directml": "dml", "gpu": "cuda"}


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class Settings(BaseSettings):
    # No populate_by_name: field names like `home` must not read unrelated env vars ($HOME).
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    # where things live
    home: Path = Field(Path("~/.cache/ortserve"), validation_alias=_env("ORTSERVE_HOME"),
                       description="Model store, ledger and telemetry root")
    model: str | None = Field(None, validation_alias=_env("ORTSERVE_MODEL", "GENAI_MODEL_DIR"),
                              description="Model id in the store, a model directory or a .gguf file (default: smollm2-135m)")
    # runtime
    device: str = Field("auto", validation_alias=_env("ORTSERVE_DEVICE", "GENAI_DEVICE"),
                        description="Execution provider: auto, cpu, cuda, dml, webgpu, openvino")
    max_length: int | None = Field(None, validation_alias=_env("ORTSERVE_MAX_LENGTH", "GENAI_MAX_LENGTH"),
                                   description="Cap on context length (prompt + output tokens)")
    max_batch: int = Field(16, ge=1, le=256, validation_alias=_env("ORTSERVE_MAX_BATCH"),
                           description="Most sequences decoded together")
    intra_op_threads: int = Field(0, ge=0, validation_alias=_env("ORTSERVE_INTRA_OP_THREADS"),
                                  description="ONNX Runtime intra-op threads (0 = all cores)")
    inter_op_threads: int = Field(0, ge=0, validation_alias=_env("ORTSERVE_INTER_OP_THREADS"),
                                  description="ONNX Runtime inter-op threads (0 = default)")
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = Field(
        "all", validation_alias=_env("ORTSERVE_GRAPH_OPT_LEVEL"),
        description="ONNX Runtime graph optimization level")
    thread_spinning: bool | Literal["auto"] = Field(
        "auto", validation_alias=_env("ORTSERVE_THREAD_SPINNING"),
        description="Let ONNX Runtime worker threads spin while waiting (faster on an idle machine, much "
                    "slower on a busy one); auto = spin when the 1-minute load average is under half the "
                    "cores when the model loads (never on Windows, which has no load average)")
    auto_build_gpu: bool = Field(True, validation_alias=_env("ORTSERVE_AUTO_BUILD_GPU"),
                                 description="With device auto on a GPU, build the model's GPU variant "
                                             "when only CPU variants are installed (needs the convert extra)")
    enable_mem_arena: bool = Field(True, validation_alias=_env("ORTSERVE_MEM_ARENA"),
                                   description="ONNX Runtime CPU memory arena")
    huge_pages: bool = Field(True, validation_alias=_env("ORTSERVE_HUGE_PAGES"),
                             description="Put a CPU model's prepacked weights in transparent huge pages (Linux; "
                                         "13-17% faster decode steps on a quiet 2-core machine, docs/bench.md)")
    prefill_chunk: int = Field(512, ge=16, validation_alias=_env("ORTSERVE_PREFILL_CHUNK"),
                               description="Prompt tokens prefilled per engine step; longer prompts are "
                                           "prefilled in chunks between decode steps")
    prefill_ratio: float = Field(2.0, ge=0, validation_alias=_env("ORTSERVE_PREFILL_RATIO"),
                                 description="While streams decode, a step's prompt chunk may take this many "
                                             "times the measured decode step (0 = prefill_chunk tokens only)")
    kv_placement: Literal["auto", "host", "device"] = Field(
        "auto", validation_alias=_env("ORTSERVE_KV_PLACEMENT"),
        description="Where the KV cache lives: auto (host for CPU, the GPU's memory for CUDA/DirectML), "
                    "host, or device (OrtValues on the provider's device, also on CPU)")
    timeout: float = Field(600.0, ge=0, validation_alias=_env("ORTSERVE_TIMEOUT"),
                           description="Per-request deadline in seconds, queue time included (0 = none); "
                                       "a request's own `timeout` field overrides it")
    stall_timeout: float = Field(120.0, gt=0, validation_alias=_env("ORTSERVE_STALL_TIMEOUT"),
                                 description="An engine step running longer than this marks the engine "
                                             "unhealthy (/healthz 503) and restarts it in process")
    last_logits_only: bool = Field(True, validation_alias=_env("ORTSERVE_LAST_LOGITS_ONLY"),
                                   description="Compute logits for the last prompt position only (a load-time "
                                               "graph edit); off runs the graph as built")
    kv_cache_mb: int = Field(0, ge=0, validation_alias=_env("ORTSERVE_KV_CACHE_MB"),
                             description="KV cache budget in MB (0 = half the free memory left after "
                                         "the model, at least 256 MB)")
    prefix_cache: bool = Field(True, validation_alias=_env("ORTSERVE_PREFIX_CACHE"),
                               description="Keep finished requests' KV (inside kv_cache_mb) and start new "
                                           "prompts from the longest shared prefix; off: prefill every prompt whole")
    lora_mode: Literal["mask", "gather"] = Field(
        "mask", validation_alias=_env("ORTSERVE_LORA_MODE"),
        description="How a batch mixing LoRA adapters computes the term (docs/lora.md): mask (every "
                    "adapter's low-rank product, masked per row) or gather (each row's weights gathered)")
    speculative: bool = Field(True, validation_alias=_env("ORTSERVE_SPECULATIVE"),
                              description="Prompt-lookup speculation: guess the next tokens from the prompt and "
                                          "output so far and verify them in one step (docs/speculative.md); "
                                          "exact, and a request's `speculative: false` turns it off for itself")
    speculative_k: int = Field(8, ge=1, le=16, validation_alias=_env("ORTSERVE_SPECULATIVE_K"),
                               description="Most tokens a speculating request guesses per step (the first "
                                           "guess takes 4; k grows while guesses hold)")
    speculative_lookup: bool = Field(True, validation_alias=_env("ORTSERVE_SPECULATIVE_LOOKUP"),
                                     description="Prompt lookup guesses first; off, only the draft model "
                                                 "guesses (docs/speculative.md)")
    draft_model: str | None = Field(None, validation_alias=_env("ORTSERVE_DRAFT_MODEL"),
                                    description="A store model (id or directory) of the same vocabulary that "
                                                "guesses tokens for the served model where prompt lookup has "
                                                "none (docs/speculative.md)")
    native: bool = Field(True, validation_alias=_env("ORTSERVE_NATIVE"),
                         description="Use ortserve's GGUF block kernels (docs/native.md) when the library is "
                                     "built and loads; off: GGUF imports and sessions use MatMulNBits graphs")
    native_isa: Literal["auto", "avx512vnni", "avx2", "scalar"] = Field(
        "auto", validation_alias=_env("ORTSERVE_NATIVE_ISA"),
        description="Highest instruction set the GGUF kernels may use (auto = the best the CPU has); "
                    "for tests and benchmarks")
    # server
    host: str = Field("127.0.0.1", validation_alias=_env("ORTSERVE_HOST", "HOST"),
                      description="Address the server binds")
    port: int = Field(8002, ge=0, le=65535, validation_alias=_env("ORTSERVE_PORT", "PORT"),
                      description="Port the server binds")
    api_key: str | None = Field(None, validation_alias=_env("ORTSERVE_API_KEY"),
                                description="Bearer key required on every route but /healthz")
    api_keys_file: Path | None = Field(None, validation_alias=_env("ORTSERVE_API_KEYS_FILE"),
                                       description="Key file, one 'NAME KEY SCOPE' a line: each key its own "
                                                   "tenant (docs/keys.md); re-read when it changes")
    cors_origins: list[str] = Field(default_factory=list, validation_alias=_env("ORTSERVE_CORS_ORIGINS"),
                                    description="Allowed CORS origins, comma-separated (none by default)")
    ui: bool = Field(True, validation_alias=_env("ORTSERVE_UI"),
                     description="Serve the web page (chat at /, dashboard at /dashboard); off: 404")
    max_queue: int = Field(64, ge=1, validation_alias=_env("ORTSERVE_MAX_QUEUE"),
                           description="Requests waiting beyond this get 429")
    max_body_bytes: int = Field(1_048_576, ge=1024, validation_alias=_env("ORTSERVE_MAX_BODY_BYTES"),
                                description="Request bodies above this get 413")
    max_tokens_cap: int = Field(4096, ge=1, validation_alias=_env("ORTSERVE_MAX_TOKENS_CAP"),
                                description="Largest max_tokens a request may ask for")
    default_max_tokens: int = Field(256, ge=1, validation_alias=_env("ORTSERVE_DEFAULT_MAX_TOKENS"),
                                    description="max_tokens when a request gives none")
    sse_ping_seconds: float = Field(15.0, ge=0, validation_alias=_env("ORTSERVE_SSE_PING_SECONDS"),
                                    description="An idle event stream gets a ': ping' comment this often, "
                                                "so proxies keep it open (0 = never)")
    # model manager (server/manager.py)
    keep_alive: float = Field(300.0, validation_alias=_env("ORTSERVE_KEEP_ALIVE"),
                              description="Seconds an idle on-demand model stays loaded (0 = unload after "
                                          "each request, -1 = never); requests may override with keep_alive")
    memory_budget_mb: int = Field(0, ge=0, validation_alias=_env("ORTSERVE_MEMORY_BUDGET_MB"),
                                  description="Memory for all loaded models in MB; idle ones are evicted LRU "
                                              "(0 = 80% of available RAM, or of GPU memory on cuda)")
    load_wait: float = Field(60.0, gt=0, validation_alias=_env("ORTSERVE_LOAD_WAIT"),
                             description="Seconds a request waits for its model to load before 503 + Retry-After")
    # embeddings and retrieval (docs/rag.md)
    embedding_model: str = Field("all-minilm-l6-v2", validation_alias=_env("ORTSERVE_EMBEDDING_MODEL"),
                                 description="Embedding model for /v1/embeddings and vector stores")
    rag_dir: Path | None = Field(None, validation_alias=_env("ORTSERVE_RAG_DIR"),
                                 description="Files and vector stores (default: HOME/rag)")
    max_upload_bytes: int = Field(20 * 1024 * 1024, ge=1024, validation_alias=_env("ORTSERVE_MAX_UPLOAD_BYTES"),
                                  description="Largest file accepted by POST /v1/files (413 above)")
    rag_queue_size: int = Field(10000, ge=1, validation_alias=_env("ORTSERVE_RAG_QUEUE_SIZE"),
                                description="Files waiting to be embedded into vector stores (429 above)")
    rag_allow_cloud: bool = Field(False, validation_alias=_env("ORTSERVE_RAG_ALLOW_CLOUD"),
                                  description="Let requests that search a vector store be routed to cloud providers")
    rag_reranker: str | None = Field(None, validation_alias=_env("ORTSERVE_RAG_RERANKER"),
                                     description="Reranker that reorders file_search hits before the answer: a "
                                                 "reranker or chat model id (docs/rerank.md); unset = fused ranking")
    # speech to text (docs/audio.md)
    audio_model: str = Field("whisper-base", validation_alias=_env("ORTSERVE_AUDIO_MODEL"),
                             description="Whisper model for /v1/audio/* when a request names none or 'whisper-1'")
    audio_concurrency: int = Field(1, ge=1, validation_alias=_env("ORTSERVE_AUDIO_CONCURRENCY"),
                                   description="Transcriptions that run at once, beside chat")
    audio_queue: int = Field(4, ge=0, validation_alias=_env("ORTSERVE_AUDIO_QUEUE"),
                             description="Transcriptions waiting beyond those running (429 above)")
    audio_threads: int = Field(0, ge=0, validation_alias=_env("ORTSERVE_AUDIO_THREADS"),
                               description="ONNX Runtime threads per Whisper model (0 = every core); fewer leave "
                                           "cores to chat")
    audio_max_seconds: float = Field(7200.0, gt=0, validation_alias=_env("ORTSERVE_AUDIO_MAX_SECONDS"),
                                     description="Longest audio a request may send, in seconds (400 above)")
    # images on the chat APIs (docs/vision.md): each limit is a 400 naming the image's field
    image_max_bytes: int = Field(20 * 1024 * 1024, ge=1, validation_alias=_env("ORTSERVE_IMAGE_MAX_BYTES"),
                                 description="Largest image a request may send, in bytes after base64 decoding")
    image_max_pixels: int = Field(50_000_000, ge=1, validation_alias=_env("ORTSERVE_IMAGE_MAX_PIXELS"),
                                  description="Most pixels (width x height, from the header) per image; Pillow's "
                                              "own decompression-bomb guard (89 M) stays below it")
    image_max_images: int = Field(8, ge=0, validation_alias=_env("ORTSERVE_IMAGE_MAX_IMAGES"),
                                  description="Most images per request")
    image_dir: Path | None = Field(None, validation_alias=_env("ORTSERVE_IMAGE_DIR"),
                                   description="Folder whose images requests may name as file:// URLs (symlinks "
                                               "resolved, nothing outside it is read); unset = file:// refused")
    # sampling defaults: what a request's unset fields become (docs/api-fields.md)
    default_temperature: float = Field(0.8, ge=0, le=2, validation_alias=_env("ORTSERVE_DEFAULT_TEMPERATURE"),
                                       description="temperature when a request and the model give none")
    default_top_p: float = Field(0.95, gt=0, le=1, validation_alias=_env("ORTSERVE_DEFAULT_TOP_P"),
                                 description="top_p when a request and the model give none")
    default_top_k: int = Field(40, ge=0, validation_alias=_env("ORTSERVE_DEFAULT_TOP_K"),
                               description="top_k when a request and the model give none (0 = off)")
    default_min_p: float = Field(0.05, ge=0, le=1, validation_alias=_env("ORTSERVE_DEFAULT_MIN_P"),
                                 description="min_p when a request and the model give none (0 = off)")
    default_typical_p: float = Field(1.0, gt=0, le=1, validation_alias=_env("ORTSERVE_DEFAULT_TYPICAL_P"),
                                     description="typical_p when a request and the model give none (1 = off)")
    default_repetition_penalty: float = Field(1.0, gt=0, le=10,
                                              validation_alias=_env("ORTSERVE_DEFAULT_REPETITION_PENALTY"),
                                              description="repetition_penalty when a request and the model give none")
    model_sampling_defaults: bool = Field(True, validation_alias=_env("ORTSERVE_MODEL_SAMPLING_DEFAULTS"),
                                          description="Prefer the model's own sampling defaults "
                                                      "(generation_config.json / GGUF) to the ones above")
    # router and telemetry
    router_config: Path | None = Field(None, validation_alias=_env("ORTSERVE_ROUTER_CONFIG"),
                                       description="Routing config file (JSON or TOML); none = local only")
    telemetry: bool = Field(False, validation_alias=_env("ORTSERVE_TELEMETRY"),
                            description="Write OpenTelemetry traces, metrics and logs to files")
    telemetry_dir: Path | None = Field(None, validation_alias=_env("ORTSERVE_TELEMETRY_DIR"),
                                       description="Telemetry directory (default: HOME/telemetry)")
    telemetry_content: bool = Field(False, validation_alias=_env("ORTSERVE_TELEMETRY_CONTENT"),
                                    description="Also record prompt and completion text (off: private)")
    http_keep_alive: float = Field(65.0, gt=0, validation_alias=_env("ORTSERVE_HTTP_KEEP_ALIVE"),
                                   description="Seconds an idle HTTP/1.1 connection stays open (uvicorn's "
                                               "5 s races clients that reuse a connection near that age)")
    log_level: str = Field("info", validation_alias=_env("ORTSERVE_LOG_LEVEL"),
                           description="Log level: debug, info, warning, error")
    crash_at: str | None = Field(None, validation_alias=_env("ORTSERVE_CRASH_AT"),
                                 description="Test only: <point>[:n][:kill|enospc] kills the process (or fills "
                                             "the disk) the n-th time a write path reaches that point "
                                             "(faults.py, docs/robustness.md); never set in production")

    @field_validator("home", "router_config", "telemetry_dir", "rag_dir", "api_keys_file", mode="after")
    @classmethod
    def _expand(cls, v: Path | None) -> Path | None:
        return v.expanduser() if v is not None else None

    @field_validator("device", mode="before")
    @classmethod
    def _device(cls, v: Any) -> str:
        d = str(v).strip().lower()
        d = DEVICE_ALIASES.get(d, d)
        if d not in DEVICES:
            raise ValueError(f"unknown device {v!r}; choose one of {', '.join(DEVICES)}")
        return d

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [o.strip() for o in v.split(",") if o.strip()]
        return v

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, dotenv_settings, _FileSource(settings_cls))

    @property
    def store_dir(self) -> Path:
        return self.home / "models"

    @property
    def telemetry_path(self) -> Path:
        return self.telemetry_dir or self.home / "telemetry"

    @property
    def rag_path(self) -> Path:
        return self.rag_dir or self.home / "rag"

    @property
    def ledger_path(self) -> Path:
        return self.home / "costs.sqlite"


def config_file() -> Path | None:
    explicit = os.environ.get("ORTSERVE_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    for name in ("ortserve.toml", "ortserve.json"):
        if Path(name).is_file():
            return Path(name)
    return None


def _ortserve_table(data: dict[str, Any]) -> dict[str, Any]:
    """A whole file of settings, or its [ortserve] table when it has one."""
    return data["ortserve"] if isinstance(data.get("ortserve"), dict) else data


class _TomlFile(TomlConfigSettingsSource):
    """pydantic-settings' TOML source. Two additions it has no option for: an optional
    [ortserve] table (toml_table_header makes it mandatory), and keys by field name (our fields
    validate by their env-var aliases, ORTSERVE_PORT, so names are mapped onto those)."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            return _ortserve_table(super()._read_file(file_path))
        except ValueError as exc:  # tomllib.TOMLDecodeError: name the file
            raise ValueError(f"{file_path}: {exc}") from exc

    def __call__(self) -> dict[str, Any]:
        return by_alias({k: v for k, v in self.toml_data.items() if k in self.settings_cls.model_fields})


class _JsonFile(JsonConfigSettingsSource):
    """pydantic-settings' JSON source (UTF-8), with the same two additions as _TomlFile."""

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            return _ortserve_table(super()._read_file(file_path))
        except ValueError as exc:  # json.JSONDecodeError: name the file
            raise ValueError(f"{file_path}: {exc}") from exc

    def __call__(self) -> dict[str, Any]:
        return by_alias({k: v for k, v in self.json_data.items() if k in self.settings_cls.model_fields})


def _FileSource(settings_cls: type[BaseSettings]) -> PydanticBaseSettingsSource:
    """The config file's source: TOML, or JSON by its suffix (none: an empty TOML source)."""
    path = config_file()
    if path is not None and path.suffix == ".json":
        return _JsonFile(settings_cls, json_file=path)
    return _TomlFile(settings_cls, toml_file=path if path is not None else [])


def env_names(name: str) -> list[str]:
    alias = Settings.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return [str(c) for c in alias.choices]
    return [name.upper()]


def describe(settings: Settings) -> list[dict[str, Any]]:
    """Every setting: name, env vars, default, current value, documentation."""
    rows = []
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        value = getattr(settings, name)
        if name == "api_key" and value:
            value = "***"
        rows.append({"name": name, "env": env_names(name), "default": _plain(default),
                     "value": _plain(value), "doc": field.description or ""})
    return rows


def _plain(v: Any) -> Any:
    return str(v) if isinstance(v, Path) else v


def load_settings(**overrides: Any) -> Settings:
    """Settings with CLI flags (non-None overrides) on top."""
    return Settings(**by_alias({k: v for k, v in overrides.items() if v is not None}))


def by_alias(values: dict[str, Any]) -> dict[str, Any]:
    """Field names -> the env-var alias pydantic-settings validates by."""
    return {env_names(k)[0]: v for k, v in values.items()}
