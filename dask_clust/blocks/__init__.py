"""The building blocks the algorithms share, each written once on the engine's verbs: seeding (k-means++,
k-means||, AFK-MC2, random rows), the lightweight coreset and working sets, Lloyd iterations, and the
k-nearest-neighbour graph (exact and IVF)."""
