"""Recipes: the pipelines that build the models the harness measures (a target and its trained drafts).

    recipes.embedded    the embedded default (models/embedded): tokenizer, corpus, target, drafts, evaluation, card
    recipes.real        the drafts of a real pretrained target (models/smollm2-135m), on the embedded recipe

The top floor: a recipe trains with dspark_core and reads its data through `inputs` (`inputs.tasks`,
`inputs.model_refs`); nothing in dspark_core, backends or harness imports a recipe.
"""
