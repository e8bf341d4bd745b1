"""ORM models, all in one place so Alembic sees the whole schema."""

from app.models.base import Base
from app.models.cluster import Deployment, Gpu, GpuLease, Node
from app.models.jobs import Job, JobEvent
from app.models.resources import Artifact, Dataset, Run, Target
from app.models.users import IdempotencyKey, Token, User
from app.models.webhooks import Webhook, WebhookDelivery

__all__ = ["Base", "User", "Token", "IdempotencyKey", "Job", "JobEvent", "Target", "Dataset",
           "Artifact", "Run", "Node", "Gpu", "GpuLease", "Deployment", "Webhook", "WebhookDelivery"]
