package kube

import (
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	kv1 "github.com/molt-sh/molt/api/kube/v1alpha1"
)

type cacheByObject = cache.ByObject

func nodeSelector(node string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{kv1.NodeLabel: node})
}

func builderPredicate(fn func(client.Object) bool) builder.Predicates {
	return builder.WithPredicates(predicate.NewPredicateFuncs(fn))
}

func apiEqual(a, b any) bool { return equality.Semantic.DeepEqual(a, b) }
