"""optimizer 3: learned budgets are in bytes of compact JSON; those learned in YAML bytes go.

The split pass now measures a document as the engine's API stores it (compact JSON) and
the adapters report a refused document's size in that unit. A size learned before was of
the YAML text, about a quarter larger for the same document, and cannot be converted
exactly (the ratio depends on the document). Keeping it would let chunks grow to the size
that was refused; a guessed factor could, if too small, keep every later chunk smaller
than need be for good (a learned budget only ever decreases). Forgetting it costs at most
one more refusal, which learns the budget again in the new unit.
"""

import sqlalchemy as sa
from alembic import op

revision = "optimizer_0003"
down_revision = "optimizer_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text("DELETE FROM optimizer_learned_budgets"))


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM optimizer_learned_budgets"))  # JSON bytes are not YAML's
