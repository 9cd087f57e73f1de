"""A Django app's own tool module, found by its name (tools/apps.py) without a setting naming it."""

from tools.kit import ToolArguments, ToolClass, ToolResult, tool


class LookupArgs(ToolArguments):
    sku: str


class Stock(ToolResult):
    sku: str
    on_hand: int


@tool("inventory.stock", arguments=LookupArgs, result=Stock, tool_class=ToolClass.READ_ONLY)
def stock(arguments: LookupArgs, *, key: str, secrets: dict, deadline: float) -> Stock:
    """How many of an item are on hand"""
    return Stock(sku=arguments.sku, on_hand=7)
