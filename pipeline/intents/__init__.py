"""Intents (pure): what a gateway's clients ask, by meaning, for a semantic cache.

A semantic cache (LiteLLM's ``redis-semantic``) answers a request with an entry whose prompt
embeds within its similarity threshold of the request's. Its clients rarely send one string
twice; they ask the same thing in other words. :mod:`.requests` takes from the gateway's request
log the requests worth an entry and the text the gateway embeds for each; the grouping into
intents is :mod:`models.intents`; :mod:`.collisions` finds a representative that would answer
another intent's prompt before it is warmed.
"""
