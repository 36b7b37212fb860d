"""A local scripted model endpoint: a STAND-IN for model providers, for offline tests and demos.

It speaks enough of the providers' HTTP APIs (Anthropic Messages, OpenAI Chat
Completions and Responses) for a real agent CLI to run against it, but no
model answers: every reply comes from a ``Script`` written in advance (text
and tool calls, in order). Whatever it serves is labelled as scripted; it is
never a measure of a model.
"""

from hangar_dagster.standins.model.script import Reply, Script, ScriptError, ToolCall
from hangar_dagster.standins.model.server import ResponseWriter, ScriptedEndpoint

__all__ = ["Reply", "ResponseWriter", "Script", "ScriptError", "ScriptedEndpoint", "ToolCall"]
