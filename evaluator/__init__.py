"""proxaudit: audit the proximal log-probability approximation of decoupled PPO."""

__version__ = "0.1.0"
