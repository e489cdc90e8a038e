"""Tune a logistic regression (scikit-learn) with an optuna study: `couler.tune`.

`make_data` writes a synthetic classification set; each trial of `train` fits a logistic
regression by stochastic gradient descent with one learning-rate / regularisation setting,
reports its validation AUC after every epoch (so the median pruner can stop a poor trial
early) and writes the final AUC, the study's objective. `report` prints the best setting.
"""

import couler.argo as couler


def make_data():
    import numpy as np
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=600, n_features=20, n_informative=6, flip_y=0.1,
                               random_state=0)
    np.savez("/tmp/data/split.npz", xtr=x[:450], ytr=y[:450], xte=x[450:], yte=y[450:])


def fit():
    import sys

    import numpy as np
    from sklearn.linear_model import SGDClassifier
    from sklearn.metrics import roc_auc_score

    from couler_runtime.tune import report

    eta0, alpha, epochs = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    d = np.load("/tmp/data/split.npz")
    model = SGDClassifier(loss="log_loss", learning_rate="constant", eta0=eta0, alpha=alpha,
                          random_state=0)
    auc = 0.5
    for epoch in range(epochs):
        model.partial_fit(d["xtr"], d["ytr"], classes=[0, 1])
        auc = roc_auc_score(d["yte"], model.predict_proba(d["xte"])[:, 1])
        report(epoch, auc)  # intermediate values: the pruner may stop this trial
    with open("/tmp/out/auc", "w") as f:
        f.write(str(auc))


data = couler.run_script(image="python:3.12", source=make_data, step_name="make-data",
                         output=couler.create_local_artifact("/tmp/data/split.npz"))


def train(eta0, alpha, epochs):
    return couler.run_script(
        image="python:3.12", source=fit, args=[eta0, alpha, epochs], input=[data],
        output=couler.create_parameter_artifact("/tmp/out/auc", name="auc"),
        step_name="train")


best = couler.tune(train, space={"eta0": couler.loguniform(1e-3, 1.0),
                                 "alpha": couler.loguniform(1e-6, 1e-1),
                                 "epochs": couler.int_range(5, 20, step=5)},
                   trials=6, parallel=2, objective="auc", direction="maximize",
                   sampler="tpe", pruner="median", seed=0)

couler.run_container(image="alpine", command=["echo"],
                     args=[best.best_params, best.best_value, best["eta0"]], step_name="report")
