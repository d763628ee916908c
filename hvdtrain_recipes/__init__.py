"""The recipes shipped with hvdtrain (image-classification, bert-finetune), written against its public API.

Installed as the top-level package ``hvdtrain_recipes`` (a name of the project, so it cannot clash
with another ``recipes`` in site-packages); the registry imports them by name, the library never does."""
