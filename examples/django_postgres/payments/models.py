from django.conf import settings
from django.db import models


class Payment(models.Model):
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT)
    amount = models.PositiveIntegerField()
    created = models.DateTimeField(auto_now_add=True)
