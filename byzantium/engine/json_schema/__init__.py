"""The shortest text that completes a prefix of JSON into a value a JSON schema accepts: how a json_schema
request ends within max_tokens (grammar.py), as JSON mode does with json_closing.py.

A schema often bounds nothing either (a string of any length, a list of any size), and a small model can
loop inside one until its budget runs out. When the tokens left are about to be just enough, the request
writes this text: the open string or number finished, an open key finished as a property its object may
have, then every open object given the required properties it lacks (each the shortest value its schema
accepts) and closed, every open array given the items its minItems asks for and closed.

This reads the common keywords (type, properties, required, additionalProperties, items, prefixItems,
minItems, minLength, maxLength, enum, const, anyOf / oneOf, a single allOf, local $ref, minimum /
maximum, exclusive bounds, multipleOf, pattern, format). What it cannot complete is None; the grammar
checks every closing before it is forced (GrammarState.forced_token), so a closing this reading gets
wrong is never written.

Read top to bottom: schemas.py (following $refs, the schema of a property or an item), numbers.py and
strings.py (a number within its bounds; a string within its lengths, pattern or format), values.py (the
shortest instance of a schema), completion.py (the closing of a prefix)."""
from .completion import closing
from .values import members, minimal

__all__ = ["closing", "members", "minimal"]
