"""The router: which provider answers a request, in what fallback order, at what cost."""

from ortserve.router.config import RouterConfig, RouterConfigError, load_config, parse_config
from ortserve.router.costs import Ledger, PriceTable
from ortserve.router.router import ChatResult, Decision, Router, RouteStart, Target

__all__ = ["ChatResult", "Decision", "Ledger", "PriceTable", "RouteStart", "Router", "RouterConfig",
           "RouterConfigError", "Target", "load_config", "parse_config"]
