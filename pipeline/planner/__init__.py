"""Warm-up planning (pure): plans as data (:mod:`.plan`), why a plan was made (:mod:`.reasons`),
where candidates come from (:mod:`.candidates`) and how they are scored and selected under
the budgets (:mod:`.select`). Every trigger plans through :func:`tasks.services.planning.plan_for`.
"""
